"""Where request preprocessing runs: a small thread pool, so the event loop stays free for /health."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import ParamSpec, TypeVar

P = ParamSpec("P")
T = TypeVar("T")


class Preprocessor:
    """Runs synchronous work on `workers` threads, or inline on the event loop when `workers` is 0."""

    def __init__(self, workers: int):
        self.workers = workers
        self._pool = ThreadPoolExecutor(workers, thread_name_prefix="preprocess") if workers else None

    async def run(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        if self._pool is None:
            return fn(*args, **kwargs)
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, lambda: fn(*args, **kwargs))

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
