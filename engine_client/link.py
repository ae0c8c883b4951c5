"""One API server's connection to one engine: a ZeroMQ DEALER, its socket monitor, the handshake and pings.

The engine's death is seen through the socket monitor (an ipc peer that exits disconnects at
once); a connection is not a ready engine, so Hello is repeated until Ready comes back. What the
engine sends is handed to the owner (engine_client/client.py), which keeps the requests.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
from typing import Protocol

import zmq
import zmq.asyncio
from zmq.utils.monitor import parse_monitor_message

from engine_client.errors import EngineUnavailable
from poolserve.model_card import ModelCard
from poolserve.protocol import (
    ClientWire,
    Frame,
    Hello,
    OutputRows,
    Outputs,
    Ping,
    Pong,
    ProtocolError,
    Ready,
    decode_rows,
)

logger = logging.getLogger("poolserve.engine_client")

HELLO_RETRY_S = 1.0
# The engine is pinged in the background this often while this API server has work on it (a request sent or
# answered within IDLE_AFTER_S); /health reads the latest answer, so a probe never waits on the engine's GIL, and an
# answer older than PONG_STALE_S means a silent engine. Idle, every IDLE_PING_INTERVAL_S: the answers only say that
# the engine is there (and what other API servers queued on it), and at ten a second an idle server (two API servers)
# took a third more CPU (0.025-0.031 against 0.017-0.021 cores: docs/benchmarks.md, "A server at idle"); the first
# request wakes the pinger at once.
PING_INTERVAL_S = 0.1
IDLE_PING_INTERVAL_S = 0.5
IDLE_AFTER_S = 1.0
PONG_STALE_S = 2.0


class LinkOwner(Protocol):
    """What a link tells the client that routes requests over it."""

    def on_outputs(self, link: EngineLink, msg: Outputs, rows: list[OutputRows]) -> None: ...

    async def on_ready(self, link: EngineLink, ready: Ready) -> None: ...

    async def on_lost(self, link: EngineLink) -> None: ...


class EngineLink:
    def __init__(
        self, context: zmq.asyncio.Context, endpoint: str, index: int, server_index: int, owner: LinkOwner
    ) -> None:
        self.endpoint = endpoint
        self.index = index
        self.server_index = server_index
        self._owner = owner
        self._socket = context.socket(zmq.DEALER)
        # What the engine's ROUTER sees, and its flight record names this server's requests by.
        self.identity = f"api-{server_index}-{os.getpid()}".encode()
        self._socket.setsockopt(zmq.IDENTITY, self.identity)
        self._socket.setsockopt(zmq.LINGER, 0)
        # Queue only on a live connection: a send with no engine fails at once instead of waiting.
        self._socket.setsockopt(zmq.IMMEDIATE, 1)
        # HANDSHAKE_SUCCEEDED, not CONNECTED: only after the ZMTP handshake does IMMEDIATE let a send through.
        self._monitor = self._socket.get_monitor_socket(zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_DISCONNECTED)
        self._wire = ClientWire()
        self._nonces = itertools.count()
        self._pings: dict[int, asyncio.Future[Pong]] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self._hello: asyncio.Task[None] | None = None
        # Set between the engine's Ready and its disconnection.
        self.ready = asyncio.Event()
        self.card: ModelCard | None = None
        self.restarts_seen = 0
        self.last_pong: Pong | None = None
        self._last_pong_at = 0.0
        # When this server last sent the engine a request or had an answer from it (loop time); the idle pinger
        # waits on `_work` so that a request ends its wait.
        self._busy_at = 0.0
        self._is_idle = False
        self._work = asyncio.Event()

    @property
    def is_ready(self) -> bool:
        return self.ready.is_set()

    def start(self) -> None:
        name = f"engine-{self.index}"
        self._tasks = [
            asyncio.create_task(self._read_replies(), name=f"{name}-replies"),
            asyncio.create_task(self._watch_connection(), name=f"{name}-monitor"),
            asyncio.create_task(self._keep_pinging(), name=f"{name}-pinger"),
        ]
        self._socket.connect(self.endpoint)

    async def close(self) -> None:
        if self._hello is not None:
            self._tasks.append(self._hello)
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self.fail_pings(EngineUnavailable("the API server is shutting down"))
        self._monitor.close()
        self._socket.close()

    async def send(self, frames: list[Frame]) -> None:
        """Send a request (or an abort) to the engine."""
        self._note_work()
        await self._send(frames)

    async def _send(self, frames: list[Frame]) -> None:
        try:
            await self._socket.send_multipart(frames, flags=zmq.NOBLOCK, copy=False)
        except zmq.Again as exc:
            raise EngineUnavailable("the engine is not accepting requests") from exc

    def _note_work(self) -> None:
        self._busy_at = asyncio.get_running_loop().time()
        if self._is_idle:
            self._is_idle = False
            self._work.set()

    async def ping(self, timeout: float) -> Pong | None:
        """A timed round trip to the engine; None when it does not answer in time."""
        if not self.ready.is_set():
            return None
        nonce = next(self._nonces)
        future: asyncio.Future[Pong] = asyncio.get_running_loop().create_future()
        self._pings[nonce] = future
        try:
            await self._send(self._wire.encode(Ping(nonce)))
            async with asyncio.timeout(timeout):
                return await future
        except (TimeoutError, EngineUnavailable):
            return None
        finally:
            self._pings.pop(nonce, None)

    def latest_pong(self) -> Pong | None:
        """The engine's latest answer to the background ping, or None when it has not answered lately."""
        loop = asyncio.get_running_loop()
        if not self.ready.is_set() or loop.time() - self._last_pong_at > PONG_STALE_S:
            return None
        return self.last_pong

    def fail_pings(self, error: Exception) -> None:
        for ping in self._pings.values():
            if not ping.done():
                ping.set_exception(error)

    async def _keep_pinging(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            pong = await self.ping(PONG_STALE_S)
            if pong is not None:
                self.last_pong, self._last_pong_at = pong, loop.time()
            if loop.time() - self._busy_at < IDLE_AFTER_S:
                await asyncio.sleep(PING_INTERVAL_S)
                continue
            self._is_idle = True
            self._work.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(IDLE_PING_INTERVAL_S):
                    await self._work.wait()

    async def _read_replies(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            frames = await self._socket.recv_multipart()
            try:
                msg = self._wire.decode(frames)
                rows = decode_rows(msg, frames[1:]) if isinstance(msg, Outputs) else []
            except ProtocolError:
                logger.exception("dropped an undecodable reply from engine %d", self.index)
                continue
            if isinstance(msg, Outputs):
                self._busy_at = loop.time()
                self._owner.on_outputs(self, msg, rows)
            elif isinstance(msg, Pong):
                ping = self._pings.get(msg.nonce)
                if ping is not None and not ping.done():
                    ping.set_result(msg)
            elif isinstance(msg, Ready):
                if self.card is not None:
                    self.restarts_seen += 1
                self.card = msg.card
                # The handshake is a round trip too: /health is right from the moment this server is ready.
                self.last_pong, self._last_pong_at = Pong(-1), asyncio.get_running_loop().time()
                await self._owner.on_ready(self, msg)

    async def _watch_connection(self) -> None:
        while True:
            event = parse_monitor_message(await self._monitor.recv_multipart())
            if event["event"] == zmq.EVENT_DISCONNECTED:
                self.ready.clear()
                self.fail_pings(EngineUnavailable("the engine went away"))
                await self._owner.on_lost(self)
            elif event["event"] == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                self._hello = asyncio.create_task(self._say_hello(), name=f"engine-{self.index}-hello")

    async def _say_hello(self) -> None:
        """A connection is not a ready engine: Hello until Ready comes back."""
        hello = self._wire.encode(Hello(self.server_index, os.getpid()))
        while not self.ready.is_set():
            with contextlib.suppress(EngineUnavailable):
                await self._send(hello)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(HELLO_RETRY_S):
                    await self.ready.wait()
