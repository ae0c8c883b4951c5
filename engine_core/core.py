"""The engine's step, with no I/O: requests in, batches through the model, finished rows and failures out.

A step is `next_batch()` then `run_batch()`: one forward pass (`begin_pass`, `forward`, `end_pass`). The process
shell (engine.py) owns the sockets, threads, heartbeats and the flight recorder, writes the record between the two
halves, and runs the three parts of a pass itself; tests drive `next_batch` and `run_batch` in process, with a real
model and no sockets.
"""

from __future__ import annotations

import logging
import time
from collections import Counter, defaultdict, deque
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt
import torch

from engine_core.admission import AdmissionLimit
from engine_core.bge_m3 import M3Runner
from engine_core.embedding_cache import EmbeddingCache, input_key
from engine_core.loader import LoadedModel
from engine_core.metrics import (
    BATCH_INPUTS,
    BATCH_TOKENS,
    FORWARD_SECONDS,
    QUEUE_SECONDS,
    engine_labels,
    observe_all,
)
from engine_core.multi_vector import MultiVectorRunner
from engine_core.pass_cost import PassCostFit
from engine_core.postprocess import finish_rows, finish_sparse_rows, l2_normalize, truncate_dimensions
from engine_core.request_state import PendingRequest
from engine_core.router import RouterRunner
from engine_core.runner import SparseRow
from engine_core.scheduler import DEFAULT_PRIORITY, PriorityPolicy, Scheduler, WorkItem
from engine_core.threads import ThreadPlan
from poolserve.model_card import CLASSIFIER, SPARSE
from poolserve.protocol import ERROR_MODEL, ForwardPass, OutputRows, PooledOutput, RequestFailed, SparseRows

logger = logging.getLogger("poolserve.engine")

F32 = npt.NDArray[np.float32]
RequestKey = tuple[bytes, int]


@dataclass(slots=True)
class StepOutputs:
    """What one step finished, by API server: each finished request's rows, and the failed requests."""

    outputs: dict[bytes, list[tuple[PooledOutput, OutputRows]]] = field(default_factory=lambda: defaultdict(list))
    failures: dict[bytes, list[RequestFailed]] = field(default_factory=lambda: defaultdict(list))

    @property
    def servers(self) -> set[bytes]:
        return self.outputs.keys() | self.failures.keys()


@dataclass(slots=True)
class StartedPass:
    """A batch on its way through the model: `EngineCore.begin_pass` made it, `end_pass` or `fail_pass` ends it."""

    batch: list[WorkItem]
    requests: list[PendingRequest]
    traced: list[PendingRequest]
    started: float
    started_ns: int
    padded: int  # the batch's tokens, padding included
    is_urgent: bool  # it holds a request with priority < 0
    nothing_waits: bool  # nothing is queued behind it: no other work wants the cores


class EngineCore:
    """The scheduler, the model runner and postprocessing, over the requests admitted so far."""

    def __init__(
        self,
        loaded: LoadedModel,
        admission: AdmissionLimit,
        cache: EmbeddingCache | None = None,
        priority: PriorityPolicy = DEFAULT_PRIORITY,
    ):
        self.card = loaded.card
        self.runner = loaded.runner
        self.scheduler = Scheduler(
            loaded.card.max_batch_tokens,
            loaded.card.max_batch_size,
            batch_overhead_tokens=loaded.batch_overhead_tokens,
            packed=loaded.packs_tokens,
            priority=priority,
        )
        self.pass_cost = PassCostFit(cap=loaded.card.max_batch_tokens)
        self.admission = admission
        self.cache = cache if cache is not None else EmbeddingCache(0)
        self._requests: dict[RequestKey, PendingRequest] = {}
        # Requests the cache answered whole when they came in, to be answered before the next step.
        self._answered_from_cache: list[PendingRequest] = []
        # Batches cut from the scheduler's current window, not run yet, and the most urgent rank (aged
        # priority) among them (None for a suspect's window, which is never displaced).
        self._batches: deque[list[WorkItem]] = deque()
        self._window_priority: int | None = None
        self.running = 0
        self.threads = ThreadPlan(loaded.card.device, torch.get_num_threads())

    @property
    def waiting(self) -> int:
        return len(self._requests) - self.running

    def queued_inputs(self) -> int:
        """Inputs waiting for a pass: in batches cut from the window and not run yet, and not in a window yet."""
        return sum(len(batch) for batch in self._batches) + self.scheduler.waiting_inputs()

    def has_work(self) -> bool:
        return bool(self._batches or self._answered_from_cache) or self.scheduler.has_work()

    def add(self, request: PendingRequest) -> None:
        """A request admitted (and counted against the admission limit) by the I/O thread; inputs the
        cache holds are answered from it, the others scheduled."""
        self._requests[request.key] = request
        if self.cache.max_bytes and not request.is_suspect:
            self._look_up(request)
            if request.remaining == 0:
                self._answered_from_cache.append(request)
                return
        self.scheduler.add(request)

    def _look_up(self, request: PendingRequest) -> None:
        request.cache_keys = [self._input_key(request, i) for i in range(request.count)]
        missing = []
        for index, key in enumerate(request.cache_keys):
            row = self.cache.get(key)
            if row is None:
                missing.append(index)
            else:
                request.add_row(index, row)
                request.cached += 1
        if request.cached:
            # Only the missing inputs are scheduled: handed to the scheduler as if given back.
            request.returned = missing[::-1]
            request.scheduled = request.count

    @staticmethod
    def _input_key(request: PendingRequest, index: int) -> bytes:
        if request.is_image(index):
            return input_key(b"image", request.image(index))
        types = None if request.token_types is None else request.input_token_types(index)
        # A text's token states, its pooled row and its sparse row are different outputs of the same ids; so are a
        # late-interaction query's vectors (expanded) and a document's.
        params = request.params
        kind = (
            b"query" if index < params.queries
            else b"tokens" if params.per_token
            else b"sparse" if params.sparse
            else b"text"
        )  # fmt: skip
        if params.pool_from and params.pool_from[index]:  # the same ids pooled from another token
            kind += b"@%d" % params.pool_from[index]
        return input_key(kind, request.input_ids(index), types)

    def take_answered_from_cache(self) -> StepOutputs | None:
        """The requests the cache answered whole since the last call; None when there were none."""
        if not self._answered_from_cache:
            return None
        done, self._answered_from_cache = self._answered_from_cache, []
        return self._finish([request for request in done if not request.is_cancelled])

    def abort(self, identity: bytes, ids: list[int]) -> None:
        """Drop requests nobody waits for any more; their inputs not yet run never will be."""
        for request_id in ids:
            request = self._requests.pop((identity, request_id), None)
            if request is not None:
                request.is_cancelled = True
                self._release(request)

    def next_batch(self) -> list[WorkItem] | None:
        """The inputs of the next forward pass (the scheduler cuts a window into batches, served in
        turn), or None when nothing is waiting. Inputs of requests aborted meanwhile are left out.
        A request more urgent than the whole window displaces the window's batches not run yet."""
        while self._batches or self.scheduler.has_work():
            window_priority = self._window_priority
            if (
                self._batches
                and window_priority is not None
                and self.scheduler.has_arrival_more_urgent_than(window_priority)
            ):
                self.scheduler.give_back([item for batch in self._batches for item in batch])
                self._batches.clear()
            if not self._batches:
                # Empty when every request left in the queue was aborted.
                batches = self.scheduler.next_batches()
                self._batches.extend(batches)
                is_suspect = any(item.request.is_suspect for batch in batches for item in batch)
                ranks = [item.rank for batch in batches for item in batch]
                self._window_priority = None if is_suspect or not ranks else min(ranks)
                continue
            live = [item for item in self._batches.popleft() if not item.request.is_cancelled]
            if live:
                return live
        return None

    def put_back(self, batch: list[WorkItem], keep: int) -> list[WorkItem]:
        """The batch's first `keep` inputs; the rest goes back to the front of the window's batches, to run next."""
        self._batches.appendleft(batch[keep:])
        return batch[:keep]

    def run_batch(self, batch: list[WorkItem]) -> StepOutputs:
        """One forward pass, and the requests it completed or failed (a failed pass fails all of its requests): its
        three parts in turn, on this thread's torch threads as `threads` plans them (engine.py runs the parts itself,
        the middle one outside its lock)."""
        started = self.begin_pass(batch)
        self.threads.apply(started.padded, is_urgent=started.is_urgent, nothing_waits=started.nothing_waits)
        try:
            rows = self.forward(started)
        except Exception as exc:
            return self.fail_pass(started, exc)
        return self.end_pass(started, rows)

    def begin_pass(self, batch: list[WorkItem]) -> StartedPass:
        """The batch's requests marked running, their queue times observed."""
        started = time.monotonic()
        requests = requests_of(batch)
        waited = [started - request.admitted_at for request in requests if request.start(started)]
        # Wall-clock time, for the traces (ForwardPass); read only when the batch holds a traced request.
        traced = [request for request in requests if request.passes is not None]
        self.running += len(waited)
        observe_all(QUEUE_SECONDS.labels(*engine_labels()), waited)
        padded = len(batch) * (self.card.image_tokens if batch[0].is_image else max(item.length for item in batch))
        return StartedPass(
            batch, requests, traced, started, time.time_ns() if traced else 0, padded,
            is_urgent=any(item.request.priority < 0 for item in batch), nothing_waits=self.queued_inputs() == 0,
        )  # fmt: skip

    def fail_pass(self, started: StartedPass, exc: Exception) -> StepOutputs:
        """A pass the model raised on: every request in it failed, with what the model said."""
        failed = started.requests
        logger.exception("forward pass failed for requests %s", [r.id for r in failed], exc_info=exc)
        return self._fail(failed, f"the model failed on this batch: {type(exc).__name__}: {exc}")

    def end_pass(self, started: StartedPass, rows: F32 | list[F32] | list[F32 | SparseRow]) -> StepOutputs:
        """The pass's rows handed to their requests (and the cache), and the requests it completed."""
        batch, padded = started.batch, started.padded
        engine = engine_labels()
        modality = "image" if batch[0].is_image else "text"
        seconds = time.monotonic() - started.started
        FORWARD_SECONDS.labels(*engine, modality).observe(seconds)
        if modality == "text" and not self.scheduler.packed:  # a packed runner's batches are filled anyway
            fixed = self.pass_cost.observe(padded, seconds)
            if fixed is not None:
                self.scheduler.batch_overhead_tokens = fixed
        BATCH_INPUTS.labels(*engine).observe(len(batch))
        BATCH_TOKENS.labels(*engine).observe(padded)
        if started.traced:
            record_pass(batch, started.traced, started.started_ns, padded)
        if self.cache.max_bytes:
            for row, item in zip(rows, batch, strict=True):
                if item.request.cache_keys:
                    self.cache.put(item.request.cache_keys[item.index], row)
        finished = [
            item.request for row, item in zip(rows, batch, strict=True) if item.request.add_row(item.index, row)
        ]
        # (a request aborted while a second lane's pass ran its inputs is answered to no one)
        return self._finish([request for request in finished if not request.is_cancelled])

    def forward(self, started: StartedPass) -> F32 | list[F32] | list[F32 | SparseRow]:
        """The model on a started pass's batch. It reads the batch's inputs and changes nothing of the core, so two
        may run at once beside the core's other calls (engine.py's second lane). The scheduler never mixes texts and
        images in a batch; it may mix pooled and per-token texts."""
        batch = started.batch
        if batch[0].is_image:
            return self.runner.run_images(np.stack([item.request.image(item.index) for item in batch]))
        rows = [item.request.input_ids(item.index) for item in batch]
        type_rows = None
        if any(item.request.token_types is not None for item in batch):
            type_rows = [item.request.input_token_types(item.index) for item in batch]
        if isinstance(self.runner, MultiVectorRunner):
            return self.runner.run_token_vectors(
                rows, type_rows, [item.index < item.request.params.queries for item in batch]
            )
        per_token = [item.request.params.per_token for item in batch]
        if isinstance(self.runner, M3Runner):
            return self.runner.run_outputs(rows, type_rows, per_token, [item.request.params.sparse for item in batch])
        pool_from = None
        starts = [item.request.params.pool_from for item in batch]
        if any(starts):  # a prompt left out of pooling (admission checked)
            pool_from = [start[item.index] if start else 0 for start, item in zip(starts, batch, strict=True)]
        if isinstance(self.runner, RouterRunner):
            is_query = [item.index < item.request.params.queries for item in batch]
            return self.runner.run_routed(rows, type_rows, is_query, per_token, pool_from)
        if pool_from is not None:
            return self.runner.run_texts_per_token(rows, type_rows, per_token, pool_from)
        if any(per_token):
            return self.runner.run_texts_per_token(rows, type_rows, per_token)
        return self.runner.run_texts(rows, type_rows)

    def _finish(self, finished: list[PendingRequest]) -> StepOutputs:
        """Complete requests' rows as their clients asked for them (normalized, truncated, activated)."""
        step = StepOutputs()
        now = time.monotonic()
        # (a sparse model's rows are normalized after their max_active_dims: finish_rows)
        together = self.card.kind not in (CLASSIFIER, SPARSE)
        normalized, are_finite = normalize_together(
            [r for r in finished if r.params.normalize and together and r.sparse_rows is None]
        )
        for request in finished:
            self._requests.pop(request.key, None)
            self._release(request)
            if request.sparse_rows is not None:
                self._finish_sparse(request, step, now)
                continue
            assert request.output is not None
            rows = normalized.get(id(request))
            if rows is not None:
                vectors = truncate_dimensions(rows, request.params.dimensions, renormalize=True)
                # Truncating finite normalized rows and normalizing them again keeps them finite.
                is_finite = are_finite or bool(np.isfinite(vectors).all())
            else:
                params = request.params
                vectors = finish_rows(
                    request.output,
                    self.card,
                    normalize=params.normalize is True,
                    activation=params.activation,
                    dimensions=params.dimensions,
                )
                is_finite = bool(np.isfinite(vectors).all())
            if not is_finite:
                rows_at = sorted({int(i) for i in np.nonzero(~np.isfinite(vectors))[0]})
                step.failures[request.identity].append(self._non_finite(request, rows_at))
                continue
            started = request.started_at or request.admitted_at
            answer: OutputRows = vectors
            nonzeros = None
            if self.card.kind == SPARSE:
                answer = SparseRows.from_dense(vectors)
                nonzeros = answer.nonzeros.tolist()
            out = PooledOutput(
                request.id,
                vectors.shape[0],
                vectors.shape[1],
                queue_time=started - request.admitted_at,
                inference_time=now - started,
                cached=request.cached,
                nonzeros=nonzeros,
                passes=request.passes,
            )
            step.outputs[request.identity].append((out, answer))
        return step

    def _non_finite(self, request: PendingRequest, rows_at: list[int]) -> RequestFailed:
        # JSON has no NaN: it would reach the client as null, or as a plausible row beside it.
        logger.error("request %s: the model computed non-finite values for its rows %s", request.id, rows_at)
        message = (
            f"the model computed non-finite values (NaN or infinity) for this request (output rows {rows_at}); "
            f"it runs in {self.card.dtype} here (--dtype)"
        )
        return RequestFailed(request.id, ERROR_MODEL, message)

    def _finish_sparse(self, request: PendingRequest, step: StepOutputs, now: float) -> None:
        """A request for the model's sparse output (bge-m3's lexical weights), its rows kept sparse throughout."""
        assert request.sparse_rows is not None
        parts = [part for part in request.sparse_rows if part is not None]
        assert len(parts) == request.count
        rows = finish_sparse_rows(parts, self.card.vocab_size, normalize=request.params.normalize is True)
        if not np.isfinite(rows.values).all():
            rows_at = sorted(
                {int(i) for i in np.repeat(np.arange(rows.count), rows.nonzeros)[~np.isfinite(rows.values)]}
            )
            step.failures[request.identity].append(self._non_finite(request, rows_at))
            return
        started = request.started_at or request.admitted_at
        out = PooledOutput(
            request.id, rows.count, rows.dim, queue_time=started - request.admitted_at, inference_time=now - started,
            cached=request.cached, nonzeros=rows.nonzeros.tolist(), passes=request.passes,
        )  # fmt: skip
        step.outputs[request.identity].append((out, rows))

    def _fail(self, failed: list[PendingRequest], error: str) -> StepOutputs:
        step = StepOutputs()
        for request in failed:
            request.is_cancelled = True
            self._requests.pop(request.key, None)
            self._release(request)
            step.failures[request.identity].append(RequestFailed(request.id, ERROR_MODEL, error))
        return step

    def _release(self, request: PendingRequest) -> None:
        if not request.is_released:
            request.is_released = True
            self.admission.release(request.count, request.total_cost)
            if request.started_at is not None:
                self.running -= 1


def normalize_together(requests: list[PendingRequest]) -> tuple[dict[int, F32], bool]:
    """The requests' rows L2-normalized in one pass over all of them (what finish_rows does to each,
    at one numpy call for the step rather than several per request), by id(request); and whether every
    value of them is finite (one check for the step; only when one is not are the requests checked each)."""
    if not requests:
        return {}, True
    outputs = [request.output for request in requests]
    assert all(output is not None for output in outputs)
    stacked = l2_normalize(np.concatenate(outputs))  # type: ignore[arg-type]
    # Plain slices: np.split costs several times more per piece, and most pieces are one row.
    rows: dict[int, F32] = {}
    start = 0
    for request, output in zip(requests, outputs, strict=True):
        end = start + len(output)  # type: ignore[arg-type]
        rows[id(request)] = stacked[start:end]
        start = end
    return rows, bool(np.isfinite(stacked).all())


def record_pass(batch: list[WorkItem], traced: list[PendingRequest], started_ns: int, padded: int) -> None:
    """Add this forward pass to each traced request's passes: its time, the batch's size and tokens, and how many
    of the batch's inputs were the request's."""
    ended_ns = time.time_ns()
    tokens = sum(item.length for item in batch)
    mine = Counter(item.request.key for item in batch)
    for request in traced:
        assert request.passes is not None
        request.passes.append(ForwardPass(started_ns, ended_ns, len(batch), tokens, padded, mine[request.key]))


def requests_of(batch: list[WorkItem]) -> list[PendingRequest]:
    """The requests with inputs in a batch, each once, in batch order."""
    return list({item.request.key: item.request for item in batch}.values())
