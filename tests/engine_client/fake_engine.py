"""A fake engine's ROUTER for the engine client's tests: the wire is real, the model is not.

It stands for an engine only where what is tested is the client's side of the wire (routing, moving a
dead engine's requests, blaming suspects); an engine's own behaviour is tested on the real one (tests/e2e).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, TypeVar

import msgspec
import numpy as np
import zmq
import zmq.asyncio

from engine_client import EngineClient
from poolserve.flight_record import encode_record
from poolserve.protocol import (
    ERROR_OVERLOADED,
    EngineRequest,
    EngineWire,
    Hello,
    Ping,
    Pong,
    PooledOutput,
    Ready,
    RequestFailed,
)
from tests.cards import CARD


class FakeEngine:
    """An engine's ROUTER that answers the handshake and pings itself and holds requests until told
    to answer them (each row is this engine's index); closing it is the engine's death."""

    def __init__(self, context: zmq.asyncio.Context, endpoint: str, index: int, suspects: list[int] | None = None):
        self.index = index
        self.suspects = suspects or []
        # What its pongs say: seconds inside the current forward pass (a hung engine's grow), and the
        # inputs it holds from every API server.
        self.stalled_for = 0.0
        self.queued_inputs = 0
        # Whether its share of the admission limit is full: it refuses every request as overloaded.
        self.is_full = False
        # Whether it answers pings (a test answers them itself, at the moment it chooses).
        self.answers_pings = True
        # The loop times of the pings it received.
        self.pinged_at: list[float] = []
        self.held: list[tuple[bytes, EngineRequest]] = []
        self.refused = 0
        self._wire = EngineWire()
        self._router = context.socket(zmq.ROUTER)
        self._router.setsockopt(zmq.LINGER, 0)
        self._router.bind(endpoint)
        self._task = asyncio.create_task(self._serve())

    async def _serve(self) -> None:
        while True:
            identity, *frames = await self._router.recv_multipart()
            msg = self._wire.decode(frames)
            if isinstance(msg, Hello):
                await self._router.send_multipart([identity, *self._wire.encode(Ready(CARD, self.suspects))])
            elif isinstance(msg, Ping):
                self.pinged_at.append(asyncio.get_running_loop().time())
                if self.answers_pings:
                    pong = Pong(msg.nonce, self.stalled_for, self.queued_inputs)
                    await self._router.send_multipart([identity, *self._wire.encode(pong)])
            elif isinstance(msg, EngineRequest) and self.is_full:
                refusal = RequestFailed(msg.id, ERROR_OVERLOADED, f"engine {self.index} is full")
                await self._router.send_multipart([identity, *self._wire.encode_outputs([], [refusal])])
                self.refused += 1
            elif isinstance(msg, EngineRequest):
                self.held.append((identity, msg))

    async def answer_all(self) -> None:
        for identity, request in self.held:
            rows = np.full((len(request.lengths), CARD.output_size), self.index, dtype=np.float32)
            out = PooledOutput(request.id, len(request.lengths), CARD.output_size)
            frames = self._wire.encode_outputs([(out, rows)])
            await self._router.send_multipart([identity, *frames], copy=False)
        self.held = []

    async def die(self) -> None:
        self._task.cancel()
        self._router.close()
        await asyncio.sleep(0)

    def ids(self) -> list[int]:
        return [request.id for _, request in self.held]

    def request(self, request_id: int) -> EngineRequest:
        return next(request for _, request in self.held if request.id == request_id)

    async def die_running(self, record: Path, running: list[int]) -> None:
        """Die in a forward pass of these requests, as the real engine leaves its flight record."""
        identities = {request.id: identity for identity, request in self.held}
        entries = [(identities[request_id], request_id) for request_id in running]
        record.write_bytes(encode_record(entries, msgspec.msgpack.Encoder()))
        await self.die()


async def until(condition: Callable[[], bool], timeout: float = 2.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "condition not met in time"
        await asyncio.sleep(0.005)


T = TypeVar("T")

SCENARIO_LIMIT_S = 30.0


def run_scenario(scenario: Coroutine[Any, Any, T]) -> T:
    """Run a test's scenario, failing it after SCENARIO_LIMIT_S: an answer that never comes is a test failure with
    its own traceback, not pytest-timeout's 300 s of the suite."""
    return asyncio.run(asyncio.wait_for(scenario, SCENARIO_LIMIT_S))


async def answered(work: asyncio.Future[T], engines: list[FakeEngine], timeout: float = 5.0) -> T:
    """`work`'s result once answered, answering whatever the engines hold until then: a resubmitted request may reach
    an engine after the first answers went out (waiting for it forever was a 300 s hang of the suite)."""
    deadline = asyncio.get_running_loop().time() + timeout
    while not work.done():
        assert asyncio.get_running_loop().time() < deadline, "the request was never answered"
        for engine in engines:
            await engine.answer_all()
        await asyncio.sleep(0.005)
    return work.result()


def job(inputs: int = 1) -> EngineRequest:
    return EngineRequest.from_rows([[101, 7, 102]] * inputs)


def two_engines(context: zmq.asyncio.Context, folder: Path) -> tuple[list[str], list[FakeEngine]]:
    endpoints = [f"ipc://{folder}/engine-{i}.sock" for i in range(2)]
    return endpoints, [FakeEngine(context, endpoint, i) for i, endpoint in enumerate(endpoints)]


async def connected_client(
    endpoints: list[str], flight_records: list[str] | None = None, **options: float
) -> EngineClient:
    """An API server's client of every engine, once each has answered its handshake."""
    client = EngineClient(endpoints, 0, flight_records=flight_records or [], **options)
    await client.connect(2)
    await until(lambda: all(link.is_ready for link in client.links))
    return client


async def shut_down(client: EngineClient, engines: list[FakeEngine], context: zmq.asyncio.Context) -> None:
    await client.close()
    for engine in engines:
        await engine.die()
    context.term()
