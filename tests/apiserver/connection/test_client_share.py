"""A client's share of one API server's connections (--max-connections-per-client), on a real socket, acceptor and
HTTP protocol: one address cannot hold every slot, and a trusted proxy is not counted."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import uvicorn
from prometheus_client import REGISTRY
from uvicorn.server import ServerState

from apiserver.connection.client_share import ClientShare
from apiserver.connection.fair_accept import FairAcceptor, ServerLoad
from apiserver.connection.http_protocol import BoundedHttpToolsProtocol, ConnectionPolicy
from poolserve.load_board import LoadBoard

# A second loopback address: a client of its own, as another host would be.
OTHER_CLIENT = "127.0.0.2"


def test_a_share_counts_each_address_apart_and_never_a_trusted_one() -> None:
    share = ClientShare(2, is_trusted=lambda address: address == "10.0.0.9")
    assert share.admit("10.0.0.1") and share.admit("10.0.0.1")
    assert not share.admit("10.0.0.1")
    assert share.admit("10.0.0.2")
    share.release("10.0.0.1")
    assert share.holding("10.0.0.1") == 1 and share.admit("10.0.0.1")
    assert all(share.admit("10.0.0.9") for _ in range(5)) and share.holding("10.0.0.9") == 0
    assert all(ClientShare(0).admit("10.0.0.1") for _ in range(5))


async def ok(scope: dict[str, Any], receive: Callable[[], Any], send: Callable[[dict[str, Any]], Any]) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
    await send({"type": "http.response.body", "body": b"ok"})


@asynccontextmanager
async def serving(share: ClientShare) -> AsyncIterator[tuple[int, ServerLoad]]:
    config = uvicorn.Config(ok, lifespan="off", log_config=None, access_log=False)
    config.load()
    board = LoadBoard.create()
    load = ServerLoad(board, board.claim_slot(), server_index=0)
    policy = ConnectionPolicy(load, clients=share)
    state = ServerState()
    sock = socket.create_server(("127.0.0.1", 0))
    acceptor = FairAcceptor(
        sock,
        lambda: BoundedHttpToolsProtocol(config, state, {}, policy=policy),
        load,
        balance_by="none",
        max_connections=512,
        clients=share,
    )
    acceptor.start()
    try:
        yield sock.getsockname()[1], load
    finally:
        acceptor.close()
        sock.close()
        await asyncio.sleep(0.05)
        board.close()


async def until(condition: Callable[[], bool], timeout: float = 2.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.005)


async def open_from(port: int, address: str = "127.0.0.1") -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_connection("127.0.0.1", port, local_addr=(address, 0))


def refused(reason: str) -> float:
    return REGISTRY.get_sample_value("poolserve_connections_refused_total", {"server": "0", "reason": reason}) or 0.0


def test_one_address_holds_at_most_its_share_and_others_still_get_in() -> None:
    """64 idle connections from one address used to fill a server for everyone: past its share, that address's
    next connection gets 503 `too_many_connections`, another address's is served, and a close frees a place."""

    async def scenario() -> None:
        share = ClientShare(2)
        async with serving(share) as (port, load):
            before = refused("client_share")
            held = [await open_from(port) for _ in range(2)]
            await until(lambda: load.connections == 2)
            reader, writer = await open_from(port)
            answer = await reader.read()
            writer.close()
            assert answer.startswith(b"HTTP/1.1 503") and b"too_many_connections" in answer, answer
            assert b"retry-after: 1" in answer
            assert refused("client_share") == before + 1
            # Another client gets in and is served.
            reader, writer = await open_from(port, OTHER_CLIENT)
            writer.write(b"GET / HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
            assert (await reader.read()).startswith(b"HTTP/1.1 200")
            writer.close()
            # One of the first address's connections closes: its place is free again.
            held[0][1].close()
            await until(lambda: share.holding("127.0.0.1") == 1)
            reader, writer = await open_from(port)
            writer.write(b"GET / HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
            assert (await reader.read()).startswith(b"HTTP/1.1 200")
            writer.close()
            for _, other in held[1:]:
                other.close()
            await until(lambda: share.holding("127.0.0.1") == 0)

    asyncio.run(scenario())


def test_a_trusted_proxy_is_not_held_to_a_share() -> None:
    async def scenario() -> None:
        share = ClientShare(1, is_trusted=lambda address: address == "127.0.0.1")
        async with serving(share) as (port, load):
            held = [await open_from(port) for _ in range(3)]
            await until(lambda: load.connections == 3)
            for _, writer in held:
                writer.close()

    asyncio.run(scenario())
