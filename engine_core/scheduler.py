"""Token-budget batching: which waiting inputs go into which forward pass, and in what order.

Requests are served first come, first served. The scheduler takes a window of the oldest
waiting inputs (a few batches' worth), sorts that window by length so that inputs of similar
length share a batch and little compute goes to padding, and cuts it into batches that respect
both the padded-token budget and the batch-size cap. A window bounds how long a newly arrived
request can be overtaken, while still giving sorting enough inputs to work with.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

WINDOW_BATCHES = 4


@dataclass(eq=False, slots=True)
class PendingRequest:
    """One request from one API server, batched as a unit however many inputs it holds."""

    identity: bytes
    id: int
    lengths: npt.NDArray[np.int64]
    tokens: npt.NDArray[np.int32]
    dimensions: int
    offsets: npt.NDArray[np.int64] = field(init=False)
    remaining: int = field(init=False)
    is_cancelled: bool = False
    output: npt.NDArray[np.float32] | None = None

    def __post_init__(self) -> None:
        self.offsets = np.zeros(len(self.lengths) + 1, dtype=np.int64)
        np.cumsum(self.lengths, out=self.offsets[1:])
        self.remaining = len(self.lengths)

    @property
    def key(self) -> tuple[bytes, int]:
        return (self.identity, self.id)

    def input_ids(self, index: int) -> npt.NDArray[np.int32]:
        return self.tokens[self.offsets[index] : self.offsets[index + 1]]


@dataclass(frozen=True, slots=True)
class WorkItem:
    request: PendingRequest
    index: int
    length: int


class Scheduler:
    def __init__(self, max_batch_tokens: int, max_batch_size: int, window_batches: int = WINDOW_BATCHES):
        if max_batch_tokens < 1 or max_batch_size < 1:
            raise ValueError("max_batch_tokens and max_batch_size must be >= 1")
        self.max_batch_tokens = max_batch_tokens
        self.max_batch_size = max_batch_size
        self.window_tokens = max_batch_tokens * window_batches
        self.window_items = max_batch_size * window_batches
        self._waiting: deque[PendingRequest] = deque()
        # Index of the next unscheduled input of the request at the head of the queue.
        self._cursor = 0

    def add(self, request: PendingRequest) -> None:
        self._waiting.append(request)

    def has_work(self) -> bool:
        return bool(self._waiting)

    @property
    def waiting_requests(self) -> int:
        return len(self._waiting)

    def next_batches(self) -> list[list[WorkItem]]:
        """Take the next window of inputs, oldest first, and cut it into batches."""
        window = self._take_window()
        window.sort(key=lambda item: item.length)
        return self._pack(window)

    def _take_window(self) -> list[WorkItem]:
        window: list[WorkItem] = []
        tokens = 0
        while self._waiting and len(window) < self.window_items and tokens < self.window_tokens:
            request = self._waiting[0]
            if request.is_cancelled:
                self._waiting.popleft()
                self._cursor = 0
                continue
            lengths = request.lengths
            count = len(lengths)
            while self._cursor < count and len(window) < self.window_items and tokens < self.window_tokens:
                length = int(lengths[self._cursor])
                window.append(WorkItem(request, self._cursor, length))
                tokens += length
                self._cursor += 1
            if self._cursor == count:
                self._waiting.popleft()
                self._cursor = 0
        return window

    def _pack(self, window: list[WorkItem]) -> list[list[WorkItem]]:
        """Cut a length-sorted window into batches; a batch costs (its size x its longest input) tokens."""
        batches: list[list[WorkItem]] = []
        batch: list[WorkItem] = []
        for item in window:
            # Sorted ascending, so this item is the longest of the batch it joins.
            padded = (len(batch) + 1) * item.length
            if batch and (len(batch) == self.max_batch_size or padded > self.max_batch_tokens):
                batches.append(batch)
                batch = []
            batch.append(item)
        if batch:
            batches.append(batch)
        return batches
