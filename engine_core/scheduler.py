"""Token-budget batching: which waiting inputs go into which forward pass, and in what order.

Requests are served first come, first served. The scheduler takes a window of the oldest
waiting inputs (a few batches' worth), sorts that window by length so that inputs of similar
length share a batch and little compute goes to padding, and cuts it into batches that respect
both the padded-token budget and the batch-size cap. A window bounds how long a newly arrived
request can be overtaken, while still giving sorting enough inputs to work with.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np

from engine_core.request_state import PendingRequest

WINDOW_BATCHES = 4


@dataclass(frozen=True, slots=True)
class WorkItem:
    """One input of a request, as the scheduler places it in a batch."""

    request: PendingRequest
    index: int
    length: int
    is_image: bool = False


class Scheduler:
    def __init__(
        self,
        max_batch_tokens: int,
        max_batch_size: int,
        window_batches: int = WINDOW_BATCHES,
        batch_overhead_tokens: float = 0.0,
    ):
        if max_batch_tokens < 1 or max_batch_size < 1:
            raise ValueError("max_batch_tokens and max_batch_size must be >= 1")
        self.max_batch_tokens = max_batch_tokens
        self.max_batch_size = max_batch_size
        # What one more forward pass costs, in tokens' worth of compute (measured at start-up):
        # padding that would cost more than this is better spent on a batch of its own.
        self.batch_overhead_tokens = batch_overhead_tokens
        self.window_tokens = max_batch_tokens * window_batches
        self.window_items = max_batch_size * window_batches
        self._waiting: deque[PendingRequest] = deque()
        self._suspects: deque[PendingRequest] = deque()
        # Index of the next unscheduled input of the request at the head of the queue.
        self._cursor = 0

    def add(self, request: PendingRequest) -> None:
        (self._suspects if request.is_suspect else self._waiting).append(request)

    def has_work(self) -> bool:
        return bool(self._waiting or self._suspects)

    @property
    def waiting_requests(self) -> int:
        return len(self._waiting) + len(self._suspects)

    def next_batches(self) -> list[list[WorkItem]]:
        """Take the next window of inputs, oldest first, and cut it into batches of one modality.

        Suspects go first (they have waited through a crash), each alone in its batches."""
        window = self._take_suspect() or self._take_window()
        window.sort(key=lambda item: (item.is_image, item.length))
        return self._pack(window)

    def _take_suspect(self) -> list[WorkItem]:
        """Every input of the oldest suspect that is still wanted, or nothing."""
        while self._suspects:
            request = self._suspects.popleft()
            if not request.is_cancelled:
                return [WorkItem(request, i, request.cost(i), request.is_image(i)) for i in range(request.count)]
        return []

    def _take_window(self) -> list[WorkItem]:
        window: list[WorkItem] = []
        tokens = 0
        while self._waiting and len(window) < self.window_items and tokens < self.window_tokens:
            request = self._waiting[0]
            if request.is_cancelled:
                self._waiting.popleft()
                self._cursor = 0
                continue
            count = request.count
            while self._cursor < count and len(window) < self.window_items and tokens < self.window_tokens:
                index = self._cursor
                length = request.cost(index)
                window.append(WorkItem(request, index, length, request.is_image(index)))
                tokens += length
                self._cursor += 1
            if self._cursor == count:
                self._waiting.popleft()
                self._cursor = 0
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
        inputs, and the last batch of that way starts at cut[j]."""
        lengths = np.fromiter((item.length for item in items), dtype=np.float64, count=len(items))
        count = len(items)
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
