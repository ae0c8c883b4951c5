"""Token-budget batching: which waiting inputs go into which forward pass, and in what order.

Who goes first. The most urgent requests: lowest `priority` (vLLM's field; default 0), where a
request's priority improves by one level for each AGING_S seconds it has waited, so less urgent work
is delayed, never starved (a request at priority p waits at most about (p - q) x AGING_S behind a
stream of work at priority q before it shares the engine with it). Ageing alone bounds nothing when a
client may ask for any level (a flood at -2**31 held a priority-0 request for 300 s, then 504), so the
operator's PriorityPolicy bounds both: the API servers refuse a priority more urgent than
`--min-priority`, and a request that has waited `--priority-max-wait` seconds ranks ahead of every
request that has not (overdue requests among themselves oldest first). Among requests of the same aged
priority, a window is filled round robin, up to one batch's worth of inputs from each request in
turn, oldest first: a small request waits about one window behind any number of big ones, not
behind all of their inputs. A request more urgent than every request in the window being run makes
the core hand back the window's batches not yet run (`give_back`) and plan again: an urgent request
waits about one batch.

How a window is cut. A window holds a few batches' worth of inputs. Each priority level in it, most
urgent first, is sorted by length so that inputs of similar length share a batch and little compute
goes to padding, and cut into batches that respect both the padded-token budget and the batch-size
cap. Where the runner packs tokens (engine_core/packed_encoder.py) padding costs next to nothing, so
the fewest passes win and batches are filled to the caps.
"""

from __future__ import annotations

import itertools
import math
import time
from collections import deque
from dataclasses import dataclass

import numpy as np

from engine_core.request_state import PendingRequest

WINDOW_BATCHES = 4
AGING_S = 5.0
# The most distinct input lengths a window may hold for its cut to be planned in plain Python over their runs
# (_cut_at_run_ends: a program of about RUN_ENDS_MAX**2 / 2 steps); beyond, numpy's program over every input.
RUN_ENDS_MAX = 48


@dataclass(frozen=True, slots=True)
class PriorityPolicy:
    """The operator's bounds on `priority` (--min-priority, --priority-max-wait; docs/api.md, "Priority")."""

    most_urgent: int = -100
    max_wait_s: float = 10.0

    def rank(self, request: PendingRequest, now: float) -> int:
        """The request's priority, one level more urgent for each AGING_S seconds it has waited, never past
        the most urgent level a request may ask for; one level beyond it once the request is overdue."""
        waited = now - request.admitted_at
        if waited >= self.max_wait_s:
            return self.most_urgent - 1
        return max(self.most_urgent, request.priority - int(waited / AGING_S))


DEFAULT_PRIORITY = PriorityPolicy()


@dataclass(slots=True)
class WorkItem:
    """One input of a request, as the scheduler places it in a batch. Not frozen, though never
    changed: a window makes thousands, and a frozen dataclass's __init__ costs several times more."""

    request: PendingRequest
    index: int
    length: int
    is_image: bool = False
    # The request's aged priority when the window was planned: a window runs its levels in turn.
    rank: int = 0


class Scheduler:
    def __init__(
        self,
        max_batch_tokens: int,
        max_batch_size: int,
        *,
        window_batches: int = WINDOW_BATCHES,
        batch_overhead_tokens: float = 0.0,
        packed: bool = False,
        priority: PriorityPolicy = DEFAULT_PRIORITY,
    ):
        if max_batch_tokens < 1 or max_batch_size < 1:
            raise ValueError("max_batch_tokens and max_batch_size must be >= 1")
        self.max_batch_tokens = max_batch_tokens
        self.max_batch_size = max_batch_size
        # What one more forward pass costs, in tokens' worth of compute (measured at start-up, refitted from
        # the passes served: engine_core/pass_cost.py):
        # padding that would cost more than this is better spent on a batch of its own.
        self.batch_overhead_tokens = batch_overhead_tokens
        # The runner computes real tokens only: padding costs no pass, so batches are filled (_fill).
        self.packed = packed
        self.priority = priority
        self.window_tokens = max_batch_tokens * window_batches
        self.window_items = max_batch_size * window_batches
        self._waiting: list[PendingRequest] = []
        self._suspects: deque[PendingRequest] = deque()
        # The most urgent priority added since the last window was planned (None: nothing added).
        self._arrived: int | None = None

    def add(self, request: PendingRequest) -> None:
        if request.is_suspect:
            self._suspects.append(request)
            return
        self._wait(request)
        self._arrived = request.priority if self._arrived is None else min(self._arrived, request.priority)

    def _wait(self, request: PendingRequest) -> None:
        if not request.is_waiting:
            request.is_waiting = True
            self._waiting.append(request)

    def has_work(self) -> bool:
        return bool(self._waiting or self._suspects)

    @property
    def waiting_requests(self) -> int:
        return len(self._waiting) + len(self._suspects)

    def waiting_inputs(self) -> int:
        """Inputs not yet placed in a window (a suspect's all)."""
        unplaced = sum(request.count - request.scheduled + len(request.returned) for request in self._waiting)
        return unplaced + sum(request.count for request in self._suspects)

    def has_arrival_more_urgent_than(self, priority: int) -> bool:
        """Whether a request more urgent than `priority` (a window's most urgent rank) came in since the last
        window was planned."""
        return self._arrived is not None and self._arrived < priority

    def next_batches(self) -> list[list[WorkItem]]:
        """Plan the next window and cut it into batches of one modality.

        Suspects go first (they have waited through a crash), each alone in its batches."""
        self._arrived = None
        window = self._take_suspect() or self._take_window()
        window.sort(key=lambda item: (item.rank, item.is_image, item.length))
        batches: list[list[WorkItem]] = []
        start = 0
        for end in range(1, len(window) + 1):  # each priority level packed on its own, most urgent first
            if end == len(window) or window[end].rank != window[start].rank:
                batches.extend(self._pack(window[start:end]))
                start = end
        return batches

    def give_back(self, items: list[WorkItem]) -> None:
        """Inputs of a window that will not run as planned: they wait again, in their requests' turn."""
        for item in items:
            request = item.request
            if not request.is_cancelled:
                request.returned.append(item.index)
                self._wait(request)

    def _take_suspect(self) -> list[WorkItem]:
        """Every input of the oldest suspect that is still wanted, or nothing."""
        while self._suspects:
            request = self._suspects.popleft()
            if not request.is_cancelled:
                return [WorkItem(request, i, request.cost(i), request.is_image(i)) for i in range(request.count)]
        return []

    def _take_window(self) -> list[WorkItem]:
        """Inputs of the most urgent requests, round robin by request within a priority, up to a window."""
        now = time.monotonic()
        rank = self.priority.rank
        ranked = sorted(
            ((rank(r, now), r) for r in self._waiting if not r.is_cancelled and r.has_unscheduled),
            key=lambda ranked_request: (ranked_request[0], ranked_request[1].admitted_at),
        )
        window: list[WorkItem] = []
        tokens = 0
        start = 0
        while start < len(ranked) and len(window) < self.window_items and tokens < self.window_tokens:
            level = ranked[start][0]
            end = start
            while end < len(ranked) and ranked[end][0] == level:
                end += 1
            turn = [request for _, request in ranked[start:end]]
            while turn and len(window) < self.window_items and tokens < self.window_tokens:
                for request in turn:
                    # Up to one batch's worth of this request's inputs, within what the window has left:
                    # an input is taken while fewer than `most` were and their tokens are under `budget`.
                    most = min(self.max_batch_size, self.window_items - len(window))
                    budget = min(self.max_batch_tokens, self.window_tokens - tokens)
                    taken = taken_tokens = 0
                    while taken < most and taken_tokens < budget and request.has_unscheduled:
                        index = request.take_next()
                        is_image = index >= request.texts
                        length = request.image_cost if is_image else request.costs[index]
                        window.append(WorkItem(request, index, length, is_image, level))
                        taken += 1
                        taken_tokens += length
                    tokens += taken_tokens
                turn = [r for r in turn if r.has_unscheduled]
            start = end
        still = []
        for request in self._waiting:
            if request.is_cancelled or not request.has_unscheduled:
                request.is_waiting = False
            else:
                still.append(request)
        self._waiting = still
        return window

    def _pack(self, window: list[WorkItem]) -> list[list[WorkItem]]:
        """Cut a window (sorted by modality, then length) into batches of one modality each."""
        batches: list[list[WorkItem]] = []
        start = 0
        for end in range(1, len(window) + 1):
            if end == len(window) or window[end].is_image != window[start].is_image:
                batches.extend(self._partition(window[start:end]))
                start = end
        return batches

    def _partition(self, items: list[WorkItem]) -> list[list[WorkItem]]:
        """The cheapest cut of length-sorted inputs into batches: each batch costs the forward pass's
        overhead plus (its size x its longest input) tokens, within the size and token caps.

        An exact dynamic program over where to cut: best[j] is the cheapest way to run the first j
        inputs, and the last batch of that way starts at cut[j]. Where a pass is worth a whole
        batch's token budget or more (a GPU bound by its launches), the fewest passes win: the
        batches are filled to the caps instead, at a small fraction of the program's cost. So are they
        where the runner packs tokens: its padding costs (nearly) nothing, so every cut only adds a pass."""
        if self.packed or self.batch_overhead_tokens >= self.max_batch_tokens:
            return self._fill(items)
        count = len(items)
        widths = [item.length for item in items]
        longest, total = max(widths), sum(widths)
        # One batch of them all, where it fits the caps and its padding costs less than a pass: any cut into two
        # or more costs another pass and saves at most that padding, so one batch is the program's answer, found
        # without the program (a Python loop of numpy calls per input).
        if count <= self.max_batch_size and (
            count == 1
            or (count * longest <= self.max_batch_tokens and count * longest - total < self.batch_overhead_tokens)
        ):
            return [items]
        if count <= self.max_batch_size and count * longest <= self.max_batch_tokens:
            cuts = self._cut_at_run_ends(widths)
            if cuts is not None:
                return [items[start:end] for start, end in itertools.pairwise(cuts)]
        lengths = np.array(widths, dtype=np.float64)
        best = np.zeros(count + 1)
        cut = np.zeros(count + 1, dtype=np.int64)
        for end in range(1, count + 1):
            starts = np.arange(max(0, end - self.max_batch_size), end)
            sizes = end - starts
            padded = sizes * lengths[end - 1]
            costs = best[starts] + self.batch_overhead_tokens + padded
            # One input alone always fits: max_batch_tokens covers the longest input (checked at load).
            costs[(padded > self.max_batch_tokens) & (sizes > 1)] = np.inf
            choice = int(np.argmin(costs))
            best[end], cut[end] = costs[choice], starts[choice]
        batches = []
        end = count
        while end > 0:
            batches.append(items[cut[end] : end])
            end = int(cut[end])
        batches.reverse()
        return batches

    def _cut_at_run_ends(self, widths: list[int]) -> list[int] | None:
        """The cheapest cut of sorted lengths into batches no cap can bind (the caller checked that the whole
        window fits them), as the positions where batches start and the window's end; None when the window has
        more distinct lengths than RUN_ENDS_MAX.

        Such a cut need only end batches where the length changes: a batch that ends inside a run of equal
        lengths can take the rest of the run from the next batch, whose longest input is no shorter, at no cost
        more. So the program runs over the runs' ends (a window of single sentences has a dozen distinct lengths
        in forty inputs), in plain Python: the per-input program's numpy calls cost ~7 µs an input."""
        ends = [end for end in range(1, len(widths)) if widths[end] != widths[end - 1]]
        ends.append(len(widths))
        if len(ends) > RUN_ENDS_MAX:
            return None
        overhead = self.batch_overhead_tokens
        points = [0, *ends]
        best = [0.0]
        cut = [0]
        for j in range(1, len(points)):
            end = points[j]
            width = widths[end - 1]
            choice, cheapest = 0, math.inf
            for i in range(j):
                cost = best[i] + overhead + (end - points[i]) * width
                if cost < cheapest:
                    choice, cheapest = i, cost
            best.append(cheapest)
            cut.append(choice)
        starts = []
        j = len(points) - 1
        while j > 0:
            starts.append(points[j])
            j = cut[j]
        starts.append(0)
        starts.reverse()
        return starts

    def _fill(self, items: list[WorkItem]) -> list[list[WorkItem]]:
        """Length-sorted inputs cut into the fewest batches within the caps, each filled in turn."""
        batches = []
        start = 0
        for end, item in enumerate(items):
            size = end - start + 1
            if end > start and (size > self.max_batch_size or size * item.length > self.max_batch_tokens):
                batches.append(items[start:end])
                start = end
        if start < len(items):
            batches.append(items[start:])
        return batches
