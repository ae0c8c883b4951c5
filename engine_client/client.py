"""Asyncio client of the engine core over a ZeroMQ DEALER: one future per request id.

The engine's death is noticed through the socket monitor (an ipc peer that exits disconnects at
once), and every request then waiting fails with EngineUnavailable instead of hanging.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
from dataclasses import dataclass

import msgspec
import zmq
import zmq.asyncio
from zmq.utils.monitor import parse_monitor_message

from engine_client.errors import EngineError, EngineUnavailable
from engine_core.protocol import (
    OUTPUT_DTYPE,
    Abort,
    Hello,
    ModelCard,
    Outputs,
    Ping,
    Pong,
    PoolRequest,
    Ready,
    make_client_decoder,
    make_encoder,
)

logger = logging.getLogger("poolserve.engine_client")


@dataclass(frozen=True, slots=True)
class PooledResult:
    """`rows` x `dim` float32 vectors, little-endian, row after row."""

    rows: int
    dim: int
    data: bytes
    dtype: str = OUTPUT_DTYPE


class EngineClient:
    def __init__(self, endpoint: str, server_index: int):
        self.endpoint = endpoint
        self.server_index = server_index
        self._context = zmq.asyncio.Context()
        self._socket = self._context.socket(zmq.DEALER)
        self._socket.setsockopt(zmq.IDENTITY, f"api-{server_index}-{os.getpid()}".encode())
        self._socket.setsockopt(zmq.LINGER, 0)
        # Queue only on a live connection: a send with no engine fails at once instead of waiting.
        self._socket.setsockopt(zmq.IMMEDIATE, 1)
        self._monitor = self._socket.get_monitor_socket(zmq.EVENT_CONNECTED | zmq.EVENT_DISCONNECTED)
        self._encoder = make_encoder()
        self._decoder = make_client_decoder()
        self._ids = itertools.count()
        self._pending: dict[int, asyncio.Future[PooledResult]] = {}
        self._pings: dict[int, asyncio.Future[None]] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self.card: ModelCard | None = None
        self.is_connected = False

    async def connect(self, timeout: float) -> ModelCard:
        """Connect and handshake; the engine answers Hello with its model card."""
        self._socket.connect(self.endpoint)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while not self.is_connected:
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise EngineUnavailable(f"no engine at {self.endpoint} after {timeout:.0f}s")
            with contextlib.suppress(TimeoutError):
                event = parse_monitor_message(await asyncio.wait_for(self._monitor.recv_multipart(), remaining))
                self.is_connected = event["event"] == zmq.EVENT_CONNECTED
        await self._socket.send(self._encoder.encode(Hello(self.server_index, os.getpid())))
        while True:
            frames = await asyncio.wait_for(self._socket.recv_multipart(), max(deadline - loop.time(), 0.001))
            msg = self._decoder.decode(frames[0])
            if isinstance(msg, Ready):
                self.card = msg.card
                break
        self._tasks = [
            asyncio.create_task(self._read_replies(), name="engine-replies"),
            asyncio.create_task(self._watch_connection(), name="engine-monitor"),
        ]
        return msg.card

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._fail_all(EngineUnavailable("the API server is shutting down"))
        self._monitor.close()
        self._socket.close()
        self._context.term()

    @property
    def in_flight(self) -> int:
        return len(self._pending)

    async def pool(self, request: PoolRequest, frames: list[bytes]) -> PooledResult:
        """Send one request (all its inputs in one message) and wait for its rows; its id is assigned here."""
        request_id = next(self._ids)
        future: asyncio.Future[PooledResult] = asyncio.get_running_loop().create_future()
        self._pending[request_id] = future
        try:
            header = self._encoder.encode(msgspec.structs.replace(request, id=request_id))
            await self._send([header, *frames])
            return await future
        except asyncio.CancelledError:
            # The caller went away (client disconnect, timeout): the engine need not compute it.
            if self._pending.pop(request_id, None) is not None:
                with contextlib.suppress(EngineUnavailable):
                    await self._send([self._encoder.encode(Abort([request_id]))])
            raise
        finally:
            self._pending.pop(request_id, None)

    async def ping(self, timeout: float) -> bool:
        """A timed round trip to the engine."""
        nonce = next(self._ids)
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        try:
            await self._send([self._encoder.encode(Ping(nonce))])
        except EngineUnavailable:
            return False
        self._pings[nonce] = future
        try:
            await asyncio.wait_for(future, timeout)
            return True
        except (TimeoutError, EngineUnavailable):
            return False
        finally:
            self._pings.pop(nonce, None)

    async def _send(self, frames: list[bytes]) -> None:
        if not self.is_connected:
            raise EngineUnavailable("the engine is not running")
        try:
            await self._socket.send_multipart(frames, flags=zmq.NOBLOCK, copy=False)
        except zmq.Again as exc:
            raise EngineUnavailable("the engine is not accepting requests") from exc

    async def _read_replies(self) -> None:
        while True:
            frames = await self._socket.recv_multipart()
            try:
                msg = self._decoder.decode(frames[0])
            except Exception:
                logger.exception("dropped an undecodable reply from the engine")
                continue
            if isinstance(msg, Outputs):
                for i, out in enumerate(msg.outputs):
                    future = self._pending.pop(out.id, None)
                    if future is None or future.done():
                        continue
                    if out.error:
                        future.set_exception(EngineError(out.error))
                    else:
                        future.set_result(PooledResult(out.rows, out.dim, frames[i + 1]))
            elif isinstance(msg, Pong):
                ping = self._pings.get(msg.nonce)
                if ping is not None and not ping.done():
                    ping.set_result(None)

    async def _watch_connection(self) -> None:
        while True:
            event = parse_monitor_message(await self._monitor.recv_multipart())
            if event["event"] == zmq.EVENT_DISCONNECTED:
                self.is_connected = False
                logger.error("lost the engine; failing %d request(s) in flight", len(self._pending))
                self._fail_all(EngineUnavailable("the engine stopped while this request was in flight"))
            elif event["event"] == zmq.EVENT_CONNECTED:
                self.is_connected = True

    def _fail_all(self, error: Exception) -> None:
        pending, self._pending = self._pending, {}
        for future in pending.values():
            if not future.done():
                future.set_exception(error)
        for ping in self._pings.values():
            if not ping.done():
                ping.set_exception(error)
