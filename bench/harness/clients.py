"""HTTP/1.1 clients the load generator can drive: a raw asyncio one and httpx/aiohttp for comparison.

The raw client is an asyncio Protocol over a keep-alive TCP connection with httptools' C parser
(already installed by uvicorn[standard]): requests are pre-encoded bytes and a reply keeps only
what the report needs, so the generator spends its core on the server, not on itself.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Protocol
from urllib.parse import urlsplit

CLIENT_KINDS = ("raw", "httpx", "aiohttp")
SERVER_HEADER = b"x-poolserve-server"


@dataclass(frozen=True, slots=True)
class Request:
    """One request to send, with its raw HTTP/1.1 bytes prepared once, before the run."""

    method: str
    path: str
    body: bytes = b""
    raw: bytes = b""


def prepare_request(method: str, path: str, body: bytes, host: str) -> Request:
    head = f"{method} {path} HTTP/1.1\r\nHost: {host}\r\nUser-Agent: poolserve-bench\r\n"
    if method != "GET" or body:
        head += f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
    return Request(method, path, body, head.encode() + b"\r\n" + body)


@dataclass(slots=True)
class Reply:
    status: int
    body: bytes
    server: str = ""


class Client(Protocol):
    async def send(self, request: Request) -> Reply: ...

    async def close(self) -> None: ...


class ConnectionClosed(ConnectionError):
    """The server closed the connection before a whole reply arrived."""


@dataclass(slots=True)
class PendingReply:
    future: asyncio.Future[Reply]
    status: int = 0
    server: str = ""
    body: list[bytes] = field(default_factory=list)


class RawConnection(asyncio.Protocol):
    """One keep-alive connection carrying one request at a time."""

    def __init__(self) -> None:
        import httptools

        self.parser = httptools.HttpResponseParser(self)
        self.transport: asyncio.Transport | None = None
        self.pending: PendingReply | None = None
        self.header_name = b""
        self.is_open = False

    # asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses, but have its methods.
        self.transport = transport  # type: ignore[assignment]
        self.is_open = True

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except Exception as exc:
            self.fail(exc)

    def connection_lost(self, exc: Exception | None) -> None:
        self.is_open = False
        self.fail(exc or ConnectionClosed("connection closed by the server"))

    # httptools callbacks
    def on_header(self, name: bytes, value: bytes) -> None:
        if self.pending is not None and name.lower() == SERVER_HEADER:
            self.pending.server = value.decode()

    def on_body(self, body: bytes) -> None:
        if self.pending is not None:
            self.pending.body.append(body)

    def on_message_complete(self) -> None:
        pending, self.pending = self.pending, None
        if pending is None or pending.future.done():
            return
        status = self.parser.get_status_code()
        if not self.parser.should_keep_alive() and self.transport is not None:
            # `Connection: close`: no further request may go on this connection.
            self.is_open = False
            self.transport.close()
        pending.future.set_result(Reply(status, b"".join(pending.body), pending.server))

    def fail(self, exc: BaseException) -> None:
        pending, self.pending = self.pending, None
        if pending is not None and not pending.future.done():
            pending.future.set_exception(exc)

    def send(self, request: Request) -> asyncio.Future[Reply]:
        assert self.transport is not None and self.pending is None
        future: asyncio.Future[Reply] = asyncio.get_running_loop().create_future()
        self.pending = PendingReply(future)
        self.transport.write(request.raw)
        return future

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()


class RawClient:
    """A pool of RawConnections: a request takes an idle connection or opens one."""

    def __init__(self, url: str):
        parts = urlsplit(url)
        self.host = parts.hostname or "127.0.0.1"
        self.port = parts.port or 80
        self.idle: list[RawConnection] = []
        self.every: list[RawConnection] = []

    async def connect(self) -> RawConnection:
        loop = asyncio.get_running_loop()
        _, connection = await loop.create_connection(RawConnection, self.host, self.port)
        self.every.append(connection)
        return connection

    async def send(self, request: Request) -> Reply:
        connection = self.idle.pop() if self.idle else await self.connect()
        if not connection.is_open:
            connection = await self.connect()
        try:
            reply = await connection.send(request)
        except BaseException:
            connection.close()
            raise
        if connection.is_open:
            self.idle.append(connection)
        return reply

    async def close(self) -> None:
        for connection in self.every:
            connection.close()
        self.idle.clear()
        self.every.clear()


class HttpxClient:
    def __init__(self, url: str, connections: int):
        import httpx

        limits = httpx.Limits(max_connections=connections, max_keepalive_connections=connections)
        self.client = httpx.AsyncClient(base_url=url, limits=limits, timeout=300)

    async def send(self, request: Request) -> Reply:
        headers = {"content-type": "application/json"} if request.body else None
        response = await self.client.request(request.method, request.path, content=request.body, headers=headers)
        return Reply(response.status_code, response.content, response.headers.get("x-poolserve-server", ""))

    async def close(self) -> None:
        await self.client.aclose()


class AiohttpClient:
    def __init__(self, url: str, connections: int):
        self.url = url.rstrip("/")
        self.connections = connections
        self.session: object | None = None

    async def send(self, request: Request) -> Reply:
        import aiohttp

        if self.session is None:
            connector = aiohttp.TCPConnector(limit=self.connections, force_close=False)
            self.session = aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=300))
        assert isinstance(self.session, aiohttp.ClientSession)
        headers = {"content-type": "application/json"} if request.body else None
        async with self.session.request(
            request.method, self.url + request.path, data=request.body or None, headers=headers
        ) as response:
            body = await response.read()
            return Reply(response.status, body, response.headers.get("x-poolserve-server", ""))

    async def close(self) -> None:
        if self.session is not None:
            import aiohttp

            assert isinstance(self.session, aiohttp.ClientSession)
            await self.session.close()


def make_client(kind: str, url: str, connections: int) -> Client:
    if kind == "raw":
        return RawClient(url)
    if kind == "httpx":
        return HttpxClient(url, connections)
    if kind == "aiohttp":
        return AiohttpClient(url, connections)
    raise ValueError(f"unknown client {kind!r}; use one of {', '.join(CLIENT_KINDS)}")
