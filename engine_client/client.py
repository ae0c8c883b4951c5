"""Asyncio client of the engine core over a ZeroMQ DEALER: one future per request id.

The engine's death is seen through the socket monitor (an ipc peer that exits disconnects at
once). Requests in flight are kept, with their frames, and resubmitted when the restarted
engine answers the handshake: pooling is a pure function of its input, so a resubmission is
safe, and clients see latency instead of errors. The new engine names the requests that were
running in a forward pass when its predecessor died; one named twice is failed as the likely
cause (a poison pill), so one bad input cannot crash-loop the server.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
from dataclasses import dataclass

import msgspec
import numpy as np
import numpy.typing as npt
import zmq
import zmq.asyncio
from zmq.utils.monitor import parse_monitor_message

from engine_client.errors import EngineError, EngineOverloaded, EngineUnavailable, PoisonPill
from poolserve.protocol import (
    ERROR_OVERLOADED,
    Abort,
    ClientWire,
    Frame,
    Hello,
    ModelCard,
    Outputs,
    Ping,
    Pong,
    PoolJob,
    PoolRequest,
    ProtocolError,
    Ready,
    decode_rows,
)

logger = logging.getLogger("poolserve.engine_client")

# A request running in two forward passes that each killed the engine is failed as the cause.
MAX_BLAMES = 2
HELLO_RETRY_S = 1.0
SEND_RETRY_S = 0.01
# The engine is pinged in the background this often; /health reads the latest answer, so a probe
# never waits on the engine's GIL, and an answer older than PONG_STALE_S means a silent engine.
PING_INTERVAL_S = 0.1
PONG_STALE_S = 2.0


@dataclass(frozen=True, slots=True)
class PooledResult:
    """One float32 row per input (texts first, then images), a read-only view of the reply's frame."""

    vectors: npt.NDArray[np.float32]
    queue_time: float = 0.0
    inference_time: float = 0.0
    cached: int = 0


@dataclass(slots=True)
class InFlight:
    """A request sent and not yet answered: its header (resubmissions bump `attempt`) and its job."""

    request: PoolRequest
    job: PoolJob
    future: asyncio.Future[PooledResult]
    blames: int = 0


class EngineClient:
    def __init__(self, endpoint: str, server_index: int, *, wait_timeout: float = 30.0):
        self.endpoint = endpoint
        self.server_index = server_index
        self.wait_timeout = wait_timeout
        self._context = zmq.asyncio.Context()
        self._socket = self._context.socket(zmq.DEALER)
        self._socket.setsockopt(zmq.IDENTITY, f"api-{server_index}-{os.getpid()}".encode())
        self._socket.setsockopt(zmq.LINGER, 0)
        # Queue only on a live connection: a send with no engine fails at once instead of waiting.
        self._socket.setsockopt(zmq.IMMEDIATE, 1)
        # HANDSHAKE_SUCCEEDED, not CONNECTED: only after the ZMTP handshake does IMMEDIATE let a send through.
        self._monitor = self._socket.get_monitor_socket(zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_DISCONNECTED)
        self._wire = ClientWire()
        self._ids = itertools.count()
        self._in_flight: dict[int, InFlight] = {}
        self._pings: dict[int, asyncio.Future[Pong]] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self._hello: asyncio.Task[None] | None = None
        # Set between the engine's Ready and its disconnection.
        self._ready = asyncio.Event()
        self.card: ModelCard | None = None
        self.restarts_seen = 0
        self.last_pong: Pong | None = None
        self._last_pong_at = 0.0

    @property
    def is_ready(self) -> bool:
        return self._ready.is_set()

    @property
    def in_flight(self) -> int:
        return len(self._in_flight)

    async def connect(self, timeout: float) -> ModelCard:
        """Connect and handshake; the engine answers Hello with its model card."""
        self._tasks = [
            asyncio.create_task(self._read_replies(), name="engine-replies"),
            asyncio.create_task(self._watch_connection(), name="engine-monitor"),
            asyncio.create_task(self._keep_pinging(), name="engine-pinger"),
        ]
        self._socket.connect(self.endpoint)
        try:
            await asyncio.wait_for(self._ready.wait(), timeout)
        except TimeoutError:
            raise EngineUnavailable(f"no engine answered at {self.endpoint} within {timeout:.0f}s") from None
        assert self.card is not None
        return self.card

    async def close(self) -> None:
        if self._hello is not None:
            self._tasks.append(self._hello)
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._fail_all(EngineUnavailable("the API server is shutting down"))
        self._monitor.close()
        self._socket.close()
        self._context.term()

    async def pool(self, job: PoolJob) -> PooledResult:
        """Send one request (all its inputs in one message) and wait for its rows; its id is assigned here.

        While the engine restarts, a new request waits for it up to `wait_timeout` seconds."""
        if not self._ready.is_set():
            try:
                await asyncio.wait_for(self._ready.wait(), self.wait_timeout)
            except TimeoutError:
                raise EngineUnavailable(f"no engine came back within {self.wait_timeout:g}s") from None
        request_id = next(self._ids)
        entry = InFlight(job.header(request_id), job, asyncio.get_running_loop().create_future())
        self._in_flight[request_id] = entry
        try:
            await self._submit(entry)
            return await entry.future
        except asyncio.CancelledError:
            # The caller went away (client disconnect, timeout): the engine need not compute it.
            if self._in_flight.pop(request_id, None) is not None and self._ready.is_set():
                with contextlib.suppress(EngineUnavailable):
                    await self._send(self._wire.encode(Abort([request_id])))
            raise
        finally:
            self._in_flight.pop(request_id, None)

    async def ping(self, timeout: float) -> Pong | None:
        """A timed round trip to the engine; None when it does not answer in time."""
        if not self._ready.is_set():
            return None
        nonce = next(self._ids)
        future: asyncio.Future[Pong] = asyncio.get_running_loop().create_future()
        self._pings[nonce] = future
        try:
            await self._send(self._wire.encode(Ping(nonce)))
            return await asyncio.wait_for(future, timeout)
        except (TimeoutError, EngineUnavailable):
            return None
        finally:
            self._pings.pop(nonce, None)

    def latest_pong(self) -> Pong | None:
        """The engine's latest answer to the background ping, or None when it has not answered lately."""
        loop = asyncio.get_running_loop()
        if not self._ready.is_set() or loop.time() - self._last_pong_at > PONG_STALE_S:
            return None
        return self.last_pong

    async def _keep_pinging(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            pong = await self.ping(PONG_STALE_S)
            if pong is not None:
                self.last_pong, self._last_pong_at = pong, loop.time()
            await asyncio.sleep(PING_INTERVAL_S)

    def fail_waiting(self, reason: str) -> None:
        """Fail every request in flight now (the API server is stopping and no engine is there)."""
        self._fail_all(EngineUnavailable(reason))

    async def _submit(self, entry: InFlight) -> None:
        """Send a request; one that cannot go now stays in flight. A refused send while the engine
        counts as ready means its death has not reached the socket monitor yet (or the send queue is
        full): retry shortly, unless the disconnect arrives first, and then the next Ready resubmits."""
        attempt = entry.request.attempt
        while True:
            try:
                await self._send(self._wire.encode_pool(entry.request, entry.job))
                return
            except EngineUnavailable:
                await asyncio.sleep(SEND_RETRY_S)
            resubmitted = entry.request.attempt != attempt
            if not self._ready.is_set() or resubmitted or entry.request.id not in self._in_flight:
                return

    async def _send(self, frames: list[Frame]) -> None:
        try:
            await self._socket.send_multipart(frames, flags=zmq.NOBLOCK, copy=False)
        except zmq.Again as exc:
            raise EngineUnavailable("the engine is not accepting requests") from exc

    async def _read_replies(self) -> None:
        while True:
            frames = await self._socket.recv_multipart()
            try:
                msg = self._wire.decode(frames)
                rows = decode_rows(msg, frames[1:]) if isinstance(msg, Outputs) else []
            except ProtocolError:
                logger.exception("dropped an undecodable reply from the engine")
                continue
            if isinstance(msg, Outputs):
                self._resolve(msg, rows)
            elif isinstance(msg, Pong):
                ping = self._pings.get(msg.nonce)
                if ping is not None and not ping.done():
                    ping.set_result(msg)
            elif isinstance(msg, Ready):
                await self._on_ready(msg)

    def _resolve(self, msg: Outputs, rows: list[npt.NDArray[np.float32]]) -> None:
        for out, vectors in zip(msg.outputs, rows, strict=True):
            entry = self._in_flight.pop(out.id, None)
            if entry is not None and not entry.future.done():
                entry.future.set_result(PooledResult(vectors, out.queue_time, out.inference_time, out.cached))
        for failure in msg.failures:
            entry = self._in_flight.pop(failure.id, None)
            if entry is not None and not entry.future.done():
                overloaded = failure.code == ERROR_OVERLOADED
                entry.future.set_exception((EngineOverloaded if overloaded else EngineError)(failure.message))

    async def _on_ready(self, ready: Ready) -> None:
        """A (new) engine answered the handshake: blame its suspects, resubmit what is in flight."""
        first = self.card is None
        self.card = ready.card
        # The handshake is a round trip too: /health is right from the moment this server is ready.
        self.last_pong, self._last_pong_at = Pong(-1), asyncio.get_running_loop().time()
        if not first:
            self.restarts_seen += 1
        suspects = set(ready.suspects)
        resubmit = []
        for request_id, entry in list(self._in_flight.items()):
            if request_id in suspects:
                entry.blames += 1
            if entry.blames >= MAX_BLAMES:
                del self._in_flight[request_id]
                logger.error("request %d was running when the engine died twice; failing it as the cause", request_id)
                entry.future.set_exception(PoisonPill(request_id))
                continue
            entry.request = msgspec.structs.replace(
                entry.request, attempt=entry.request.attempt + 1, is_suspect=entry.blames > 0
            )
            resubmit.append(entry)
        self._ready.set()
        if resubmit:
            logger.warning("engine is back; resubmitting %d request(s) that were in flight", len(resubmit))
        for entry in resubmit:
            await self._submit(entry)

    async def _watch_connection(self) -> None:
        while True:
            event = parse_monitor_message(await self._monitor.recv_multipart())
            if event["event"] == zmq.EVENT_DISCONNECTED:
                self._ready.clear()
                logger.error("lost the engine; %d request(s) in flight will be resubmitted", len(self._in_flight))
                for ping in self._pings.values():
                    if not ping.done():
                        ping.set_exception(EngineUnavailable("the engine went away"))
            elif event["event"] == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                self._hello = asyncio.create_task(self._say_hello(), name="engine-hello")

    async def _say_hello(self) -> None:
        """A connection is not a ready engine: Hello until Ready comes back (which resubmits)."""
        hello = self._wire.encode(Hello(self.server_index, os.getpid()))
        while not self._ready.is_set():
            with contextlib.suppress(EngineUnavailable):
                await self._send(hello)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._ready.wait(), HELLO_RETRY_S)

    def _fail_all(self, error: Exception) -> None:
        in_flight, self._in_flight = self._in_flight, {}
        for entry in in_flight.values():
            if not entry.future.done():
                entry.future.set_exception(error)
        for ping in self._pings.values():
            if not ping.done():
                ping.set_exception(error)
