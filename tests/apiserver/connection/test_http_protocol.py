"""The read timeouts in the HTTP protocol itself, on a real loop and socket: what must not time out."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import pytest
import uvicorn
from prometheus_client import REGISTRY
from uvicorn.server import ServerState

from apiserver.connection.fair_accept import ServerLoad
from apiserver.connection.http_protocol import BoundedHttpToolsProtocol, ConnectionPolicy
from apiserver.errors import ERROR_STYLE, TEI
from poolserve.load_board import LoadBoard

TIMEOUT_S = 0.2
# How long the route below leaves the body unread: several timeouts.
ROUTE_DELAY_S = 4 * TIMEOUT_S

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]


async def slow_route(scope: Scope, receive: Receive, send: Send) -> None:
    """Reads nothing for ROUTE_DELAY_S, then the whole body; answers with its length."""
    await asyncio.sleep(ROUTE_DELAY_S)
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return
        size += len(message.get("body", b""))
        if not message.get("more_body"):
            break
    answer = str(size).encode()
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"%d" % len(answer))]})
    await send({"type": "http.response.body", "body": answer})


@asynccontextmanager
async def serving(keep_alive_s: float = 5.0, app: Any = slow_route, send_timeout_s: float = 0.0) -> AsyncIterator[int]:
    config = uvicorn.Config(app, lifespan="off", log_config=None, access_log=False, timeout_keep_alive=keep_alive_s)
    config.load()
    board = LoadBoard.create()
    load = ServerLoad(board, board.claim_slot(), server_index=0)
    policy = ConnectionPolicy(load, header_timeout_s=TIMEOUT_S, body_timeout_s=TIMEOUT_S, send_timeout_s=send_timeout_s)
    state = ServerState()

    def accepted() -> BoundedHttpToolsProtocol:
        load.connection_opened()  # as the acceptor does
        return BoundedHttpToolsProtocol(config, state, {}, policy=policy)

    server = await asyncio.get_running_loop().create_server(accepted, "127.0.0.1", 0)
    try:
        yield server.sockets[0].getsockname()[1]
    finally:
        server.close()
        await server.wait_closed()
        board.close()


async def exchange(port: int, head: bytes, body: bytes, *, wait_for_continue: bool = False) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(head)
        if wait_for_continue:
            assert await reader.readuntil(b"\r\n\r\n") == b"HTTP/1.1 100 Continue\r\n\r\n"
        writer.write(body)
        return await reader.read()  # the request says `Connection: close`
    finally:
        writer.close()
        await writer.wait_closed()


def post_head(length: int, *extra: bytes) -> bytes:
    return b"POST / HTTP/1.1\r\nhost: x\r\nconnection: close\r\ncontent-length: %d\r\n%s\r\n" % (
        length,
        b"".join(line + b"\r\n" for line in extra),
    )


@pytest.mark.parametrize("size", [1000, 1_000_000])
def test_a_body_the_route_has_not_read_yet_is_not_timed_out(size: int) -> None:
    """Sent at once, then nothing more: the route reads it late. A small body sits in uvicorn's buffer;
    a large one makes uvicorn stop reading the socket (flow control). Neither is the client's delay."""

    async def scenario() -> bytes:
        async with serving() as port:
            return await exchange(port, post_head(size), b"x" * size)

    answer = asyncio.run(scenario())
    assert answer.startswith(b"HTTP/1.1 200 OK\r\n"), answer[:200]
    assert answer.endswith(b"\r\n\r\n%d" % size)


def test_a_client_waiting_for_100_continue_is_not_timed_out_before_the_route_asks() -> None:
    async def scenario() -> bytes:
        async with serving() as port:
            return await exchange(port, post_head(5, b"expect: 100-continue"), b"hello", wait_for_continue=True)

    answer = asyncio.run(scenario())
    assert answer.startswith(b"HTTP/1.1 200 OK\r\n"), answer[:200]


def test_a_body_that_stops_coming_while_the_route_waits_for_it_is_timed_out() -> None:
    async def scenario() -> bytes:
        async with serving() as port:
            return await exchange(port, post_head(10), b"12345")

    answer = asyncio.run(scenario())
    assert answer.startswith(b"HTTP/1.1 408 Request Timeout\r\n"), answer[:200]


def test_a_stalled_body_is_answered_in_the_style_its_route_recorded() -> None:
    async def tei_route(scope: Scope, receive: Receive, send: Send) -> None:
        scope.setdefault("state", {})[ERROR_STYLE] = TEI  # as the app's middleware records it
        await slow_route(scope, receive, send)

    async def scenario() -> bytes:
        async with serving(app=tei_route) as port:
            return await exchange(port, post_head(10), b"12345")

    answer = asyncio.run(scenario())
    assert answer.startswith(b"HTTP/1.1 408 Request Timeout\r\n"), answer[:200]
    assert json.loads(answer.split(b"\r\n\r\n", 1)[1])["error_type"] == "Validation"


def timed_out(reason: str) -> float:
    value = REGISTRY.get_sample_value("poolserve_connections_timed_out_total", {"server": "0", "reason": reason})
    return value or 0.0


def test_each_close_for_slowness_is_counted_by_reason() -> None:
    before = {reason: timed_out(reason) for reason in ("header", "body", "idle")}

    async def scenario() -> None:
        async with serving(keep_alive_s=TIMEOUT_S) as port:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n")
            await reader.readuntil(b"\r\n\r\n0")  # answered, kept alive, then idle
            assert await asyncio.wait_for(reader.read(), 2) == b""  # closed by the keep-alive timeout
            writer.close()
            await writer.wait_closed()
            await exchange(port, post_head(10), b"12345")  # a body that stalls
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            assert await asyncio.wait_for(reader.read(), 2) == b""  # nothing sent, closed without a word
            writer.close()
            await writer.wait_closed()

    asyncio.run(scenario())
    assert {reason: timed_out(reason) - before[reason] for reason in before} == {"header": 1, "body": 1, "idle": 1}


def test_half_a_head_on_a_connection_kept_alive_after_an_answer_gets_408() -> None:
    async def scenario() -> bytes:
        async with serving() as port:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            try:
                writer.write(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n")
                await reader.readuntil(b"\r\n\r\n0")
                writer.write(b"GET / HTTP/1.1\r\n")
                return await asyncio.wait_for(reader.read(), 2)
            finally:
                writer.close()
                await writer.wait_closed()

    answer = asyncio.run(scenario())
    assert answer.startswith(b"HTTP/1.1 408 Request Timeout\r\n"), answer
    assert b"header_timeout" in answer


async def large_answer(scope: Scope, receive: Receive, send: Send) -> None:
    """Answers 16 MB whatever the request: more than the socket's buffers hold."""
    answer = b"x" * (16 << 20)
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"%d" % len(answer))]})
    await send({"type": "http.response.body", "body": answer})


def test_an_answer_nobody_reads_is_dropped_after_the_send_timeout() -> None:
    """A client that sends a request and never reads holds the answer's memory and a slot: --send-timeout (nginx's
    send_timeout) drops the connection once the socket's buffers have stayed full that long."""

    async def scenario() -> tuple[float, bytes]:
        async with serving(app=large_answer, send_timeout_s=TIMEOUT_S) as port:
            reader, writer = await asyncio.open_connection("127.0.0.1", port, limit=1 << 16)
            writer.transport.set_write_buffer_limits(0)
            writer.transport.pause_reading()  # this client reads nothing: the kernel buffers fill
            writer.write(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n")
            started = time.monotonic()
            await asyncio.sleep(6 * TIMEOUT_S)
            writer.transport.resume_reading()
            received = b""
            with contextlib.suppress(ConnectionError):
                while chunk := await reader.read(1 << 20):
                    received += chunk
            writer.close()
            return time.monotonic() - started, received

    elapsed, received = asyncio.run(scenario())
    # Dropped: the answer never arrives whole (the connection ends after what the buffers held).
    assert received.startswith(b"HTTP/1.1 200 OK") and len(received) < (16 << 20), len(received)
    assert elapsed < 10
