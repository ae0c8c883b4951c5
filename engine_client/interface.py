"""What an API server asks of the engine, as a typing.Protocol: the seam between routes and the engine.

Routes and the request cycle depend on this, not on a transport: `EngineClient` implements it over
ZeroMQ for a real engine process; `InProcessEngine` answers in the same process from a function
(as httpx's MockTransport does for HTTP), so the API layer runs without sockets or an engine.
"""

from __future__ import annotations

from typing import Protocol

from engine_client.client import PooledResult
from poolserve.protocol import EngineRequest, Pong


class PoolingEngine(Protocol):
    async def pool(self, request: EngineRequest) -> PooledResult:
        """Run one request (its arrays and options; the engine side gives it its id) and return its rows.

        Raises EngineUnavailable, EngineOverloaded or EngineError (engine_client.errors); cancelling
        the call drops the work."""
        ...

    def latest_pong(self) -> Pong | None:
        """The engine's latest health answer, or None when it has not answered lately."""
        ...

    def silent_engines(self) -> list[int]:
        """With several engines, the indexes of those that have not answered lately (restarting, or out of
        service), while others serve."""
        ...
