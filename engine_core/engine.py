"""The engine loop: takes requests from the I/O thread, runs batches, sends each request's result back."""

from __future__ import annotations

import logging
import queue
import time
from collections import defaultdict
from collections.abc import Callable

import numpy as np
import numpy.typing as npt
import zmq

from engine_core.admission import AdmissionLimit
from engine_core.flight_recorder import FlightRecorder
from engine_core.io_thread import OUTBOX_ENDPOINT, EngineIO, InboxItem
from engine_core.loader import LoadedModel
from engine_core.metrics import (
    BATCH_INPUTS,
    BATCH_TOKENS,
    FORWARD_SECONDS,
    INPUTS_QUEUED,
    QUEUE_SECONDS,
    REQUESTS_RUNNING,
    REQUESTS_WAITING,
)
from engine_core.postprocess import finish_rows
from engine_core.request_state import PendingRequest
from engine_core.scheduler import Scheduler, WorkItem
from poolserve.protocol import ERROR_MODEL, EngineWire, PooledOutput, RequestFailed

logger = logging.getLogger("poolserve.engine")

IDLE_WAIT_S = 0.2
BEAT_INTERVAL_S = 1.0


class EngineCore:
    def __init__(
        self,
        loaded: LoadedModel,
        endpoint: str,
        *,
        admission: AdmissionLimit,
        recorder: FlightRecorder,
        beat: Callable[[], None],
    ):
        self.card = loaded.card
        self.runner = loaded.runner
        self.scheduler = Scheduler(
            loaded.card.max_batch_tokens,
            loaded.card.max_batch_size,
            batch_overhead_tokens=loaded.batch_overhead_tokens,
        )
        self.admission = admission
        self.recorder = recorder
        self._beat = beat
        self._last_beat = 0.0
        # Set while a forward pass runs; the I/O thread reports how long it has run (a hang).
        self._step_started: float | None = None
        suspects = recorder.read_suspects()
        if suspects:
            logger.warning("%d request(s) were running when the last engine died", sum(map(len, suspects.values())))
        recorder.open()
        self._context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        self.io = EngineIO(
            self._context, endpoint, loaded.card, admission=admission, suspects=suspects, stalled_for=self.stalled_for
        )
        self._outbox = self._context.socket(zmq.PUSH)
        self._outbox.setsockopt(zmq.LINGER, 0)
        self._outbox.connect(OUTBOX_ENDPOINT)
        self._wire = EngineWire()
        self._requests: dict[tuple[bytes, int], PendingRequest] = {}
        self._running = 0
        self.should_exit = False

    def run(self) -> None:
        self.io.start()
        try:
            while not self.should_exit:
                self._heartbeat()
                self._drain(block=not self.scheduler.has_work())
                if not self.scheduler.has_work():
                    continue
                for batch in self.scheduler.next_batches():
                    # Aborts that arrived since the window was cut still save their compute.
                    self._drain(block=False)
                    self._run_batch(batch)
                    self._heartbeat()
        finally:
            self.io.stop()
            self._outbox.close()
            self._context.term()
            self.recorder.close()

    def request_exit(self) -> None:
        self.should_exit = True

    def stalled_for(self) -> float:
        started = self._step_started
        return 0.0 if started is None else time.monotonic() - started

    def _heartbeat(self) -> None:
        """Beats come from this loop, so a forward pass that never returns stops them."""
        now = time.monotonic()
        if now - self._last_beat >= BEAT_INTERVAL_S:
            self._last_beat = now
            self._beat()
        REQUESTS_WAITING.set(len(self._requests) - self._running)
        REQUESTS_RUNNING.set(self._running)
        INPUTS_QUEUED.set(self.admission.inputs)

    def _drain(self, block: bool) -> None:
        try:
            item = self.io.inbox.get(timeout=IDLE_WAIT_S) if block else self.io.inbox.get_nowait()
            while True:
                self._accept(item)
                item = self.io.inbox.get_nowait()
        except queue.Empty:
            return

    def _accept(self, item: InboxItem) -> None:
        if isinstance(item, PendingRequest):
            self._requests[item.key] = item
            self.scheduler.add(item)
            return
        identity, abort = item
        for request_id in abort.ids:
            request = self._requests.pop((identity, request_id), None)
            if request is not None:
                request.is_cancelled = True
                self._release(request)

    def _release(self, request: PendingRequest) -> None:
        if not request.is_released:
            request.is_released = True
            self.admission.release(request.count, request.total_cost)
            if request.started_at is not None:
                self._running -= 1

    def _run_batch(self, batch: list[WorkItem]) -> None:
        live = [item for item in batch if not item.request.is_cancelled]
        if not live:
            return
        running = {item.request.key: item.request for item in live}
        self.recorder.record(running)
        self._step_started = started = time.monotonic()
        for request in running.values():
            if request.started_at is None:
                request.started_at = started
                self._running += 1
                QUEUE_SECONDS.observe(started - request.admitted_at)
        try:
            rows = self._forward(live)
        except Exception as exc:
            failed = list(running.values())
            logger.exception("forward pass failed for requests %s", [r.id for r in failed])
            for request in failed:
                request.is_cancelled = True
            self._reply([], failed, f"the model failed on this batch: {type(exc).__name__}: {exc}")
            return
        finally:
            self._step_started = None
            self.recorder.clear()
        is_image = live[0].is_image
        FORWARD_SECONDS.labels(modality="image" if is_image else "text").observe(time.monotonic() - started)
        BATCH_INPUTS.observe(len(live))
        BATCH_TOKENS.observe(len(live) * max(item.length for item in live))
        finished: list[PendingRequest] = []
        for row, item in enumerate(live):
            request = item.request
            if request.output is None:
                request.output = np.empty((request.count, rows.shape[1]), dtype=np.float32)
            request.output[item.index] = rows[row]
            request.remaining -= 1
            if request.remaining == 0:
                finished.append(request)
        self._reply(finished, [], "")

    def _forward(self, batch: list[WorkItem]) -> npt.NDArray[np.float32]:
        """One forward pass; the scheduler never mixes texts and images in a batch."""
        if batch[0].is_image:
            return self.runner.run_images(np.stack([item.request.image(item.index) for item in batch]))
        rows = [item.request.input_ids(item.index) for item in batch]
        type_rows = None
        if any(item.request.token_types is not None for item in batch):
            type_rows = [item.request.input_token_types(item.index) for item in batch]
        return self.runner.run_texts(rows, type_rows)

    def _reply(self, finished: list[PendingRequest], failed: list[PendingRequest], error: str) -> None:
        """Send results and errors, one message per API server."""
        outputs: dict[bytes, list[tuple[PooledOutput, npt.NDArray[np.float32]]]] = defaultdict(list)
        failures: dict[bytes, list[RequestFailed]] = defaultdict(list)
        for request in finished:
            self._requests.pop(request.key, None)
            self._release(request)
            assert request.output is not None
            vectors = finish_rows(
                request.output,
                self.card,
                normalize=request.normalize,
                activation=request.activation,
                dimensions=request.dimensions,
            )
            started = request.started_at or request.admitted_at
            out = PooledOutput(
                request.id,
                vectors.shape[0],
                vectors.shape[1],
                queue_time=started - request.admitted_at,
                inference_time=time.monotonic() - started,
            )
            outputs[request.identity].append((out, vectors))
        for request in failed:
            self._requests.pop(request.key, None)
            self._release(request)
            failures[request.identity].append(RequestFailed(request.id, ERROR_MODEL, error))
        for identity in outputs.keys() | failures.keys():
            frames = self._wire.encode_outputs(outputs.get(identity, []), failures.get(identity, []))
            self._outbox.send_multipart([identity, *frames], copy=False)
