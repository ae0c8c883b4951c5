"""An engine in the API server's own process: requests are answered by a function, no socket, no engine.

httpx's MockTransport for the engine wire: the API layer (routes, the request cycle, limits,
errors) runs unchanged against whatever the function computes, in milliseconds.
"""

from __future__ import annotations

import inspect
import itertools
from collections.abc import Awaitable, Callable

from engine_client.client import PooledResult
from poolserve.protocol import EngineRequest, Pong

Answer = Callable[[EngineRequest], PooledResult | Awaitable[PooledResult]]


class InProcessEngine:
    """Implements PoolingEngine by calling `answer` (sync or async) with each request.

    Request ids are assigned here, as EngineClient assigns them; `requests` keeps every request sent."""

    def __init__(self, answer: Answer):
        self.answer = answer
        self.requests: list[EngineRequest] = []
        self._ids = itertools.count()

    async def pool(self, request: EngineRequest) -> PooledResult:
        request.id = next(self._ids)
        self.requests.append(request)
        result = self.answer(request)
        return await result if inspect.isawaitable(result) else result

    def latest_pong(self) -> Pong | None:
        return Pong(0)

    def silent_engines(self) -> list[int]:
        return []
