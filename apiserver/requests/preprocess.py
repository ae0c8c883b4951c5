"""Where a request's synchronous work runs (parsing it, rendering its answer): a small thread pool, so the
event loop stays free for /health.

Small work runs inline: handing a one-sentence request to a thread and back costs more (a wake-up
and two GIL hand-offs) than tokenizing it, and blocks the loop for less time than that hand-off.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import ParamSpec, TypeVar

P = ParamSpec("P")
T = TypeVar("T")

# Work on at most this many bytes (of request body, or of output rows) runs inline: tens of microseconds.
INLINE_MAX_BYTES = 2048


class Preprocessor:
    """Runs synchronous work on `workers` threads; inline on the event loop when `workers` is 0 or the
    work is small (`size`, in bytes of input or output, at most INLINE_MAX_BYTES)."""

    def __init__(self, workers: int):
        self.workers = workers
        self._pool = ThreadPoolExecutor(workers, thread_name_prefix="preprocess") if workers else None

    def is_inline(self, size: int) -> bool:
        """Whether work of `size` bytes runs inline: a caller can then skip `run`'s coroutine."""
        return self._pool is None or size <= INLINE_MAX_BYTES

    async def run(self, size: int, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        if self.is_inline(size):
            return fn(*args, **kwargs)
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, lambda: fn(*args, **kwargs))

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
