from __future__ import annotations

import asyncio
import threading

from apiserver.requests.preprocess import INLINE_MAX_BYTES, Preprocessor


def test_small_work_runs_on_the_loop_and_big_work_on_the_pool() -> None:
    async def where(preprocess: Preprocessor, size: int) -> str:
        return await preprocess.run(size, lambda: threading.current_thread().name)

    pooled = Preprocessor(1)
    inline = Preprocessor(0)
    try:
        main = threading.current_thread().name
        assert asyncio.run(where(pooled, 10)) == main
        assert asyncio.run(where(pooled, INLINE_MAX_BYTES + 1)).startswith("preprocess")
        assert asyncio.run(where(inline, 10_000_000)) == main
    finally:
        pooled.close()
