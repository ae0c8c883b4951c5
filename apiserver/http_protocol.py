"""uvicorn's httptools protocol with a bound on the request line and headers, and connections that retire.

Heads: 431 past MAX_HEAD_BYTES; 400 for an HTTP/1.1 request without exactly one `Host` header.

uvicorn's httptools protocol buffers a request's head, however long, until it ends: a client could send a
header of gigabytes and the body limit (apiserver/body_limit.py) would never see it. This subclass counts
what arrives while a head is incomplete and answers 431 once it passes the bound, closing the connection.
The count may miss one read's worth of bytes (the read that starts a request), so the memory a head can
take is bounded by MAX_HEAD_BYTES plus one read.

Host: RFC 9112 3.2 says a server must answer 400 to an HTTP/1.1 request with no Host header or more than
one (HTTP/1.0 may leave it out). uvicorn passes both to the app; checking here, before the request
cycle starts, holds for every route. The check raises inside the parser's callback, so the parser stops
and uvicorn's own malformed-request path answers (a WARNING line, then 400 and the connection closed),
with this module's JSON body naming the problem.

Retiring: a keep-alive connection lands on one API server for its whole life, so the few long-lived
connections of a proxy would never spread over servers added or restarted after they opened. Past
--max-requests-per-connection requests or --max-connection-age seconds, the response to the
request being read carries `Connection: close` and the connection closes once it is sent (a
request is never cut); the client's next connection goes through fair accept again. Requests a
client pipelined behind that response are not read (RFC 9112 9.6: the client retries them on a
new connection), as with nginx's `keepalive_requests`.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import msgspec
from uvicorn.config import Config as UvicornConfig
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn.server import ServerState

from apiserver.errors import ErrorBody, ErrorDetail
from apiserver.fair_accept import ServerLoad
from apiserver.metrics import CONNECTIONS_RECYCLED

# Request line and headers together. Browsers, proxies and servers settle around 8 to 64 KiB (nginx reads
# 4 x 8 KiB, Node 16 KiB); a bearer key and a few cookies fit many times over.
MAX_HEAD_BYTES = 64 * 1024


def error_body(message: str, code: str) -> bytes:
    return msgspec.json.encode(ErrorBody(ErrorDetail(message, "invalid_request_error", None, code)))


TOO_LARGE = error_body(
    f"The request line and headers are larger than this server's limit of {MAX_HEAD_BYTES} bytes.",
    "headers_too_large",
)


@dataclass(frozen=True, slots=True)
class ConnectionPolicy:
    """What every connection of one API server shares: its load count and when it retires (0: never)."""

    load: ServerLoad
    max_requests: int = 0
    max_age_s: float = 0.0


def host_problem(http_version: str, headers: list[tuple[bytes, bytes]]) -> str:
    """Why the head breaks RFC 9112's one-Host rule ("" when it does not); names arrive lower-cased."""
    if http_version != "1.1":
        return ""
    count = sum(1 for name, _ in headers if name == b"host")
    if count == 1:
        return ""
    return "An HTTP/1.1 request needs one Host header; this one has " + ("none." if not count else f"{count}.")


class InvalidHead(Exception):
    """Raised in a parser callback to stop parsing; uvicorn's data_received then answers 400."""


class BoundedHttpToolsProtocol(HttpToolsProtocol):
    is_reading_head = True
    head_bytes = 0
    head_problem = ""

    def __init__(
        self,
        config: UvicornConfig,
        server_state: ServerState,
        app_state: dict[str, Any],
        _loop: asyncio.AbstractEventLoop | None = None,
        *,
        policy: ConnectionPolicy,
    ) -> None:
        super().__init__(config, server_state, app_state, _loop)
        self.policy = policy
        self.requests_read = 0
        self.opened_at = self.loop.time()
        self.is_counted = True  # the acceptor counted this connection when it accepted it

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        if self.is_counted:
            self.is_counted = False
            self.policy.load.connection_closed()

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self.is_reading_head = True
        self.head_bytes = 0

    def on_headers_complete(self) -> None:
        self.is_reading_head = False
        self.head_problem = host_problem(self.parser.get_http_version(), self.headers)
        if self.head_problem:
            raise InvalidHead(self.head_problem)
        super().on_headers_complete()
        self.requests_read += 1
        reason = self.retirement_reason()
        if reason and self.cycle is not None and self.cycle.keep_alive:
            # Read when the response starts: it then says `Connection: close` and the transport closes after it.
            self.cycle.keep_alive = False
            CONNECTIONS_RECYCLED.labels(server=self.policy.load.label, reason=reason).inc()

    def retirement_reason(self) -> str:
        policy = self.policy
        if policy.max_requests and self.requests_read >= policy.max_requests:
            return "requests"
        if policy.max_age_s and self.loop.time() - self.opened_at >= policy.max_age_s:
            return "age"
        return ""

    def data_received(self, data: bytes) -> None:
        if self.is_reading_head:
            self.head_bytes += len(data)
        super().data_received(data)
        if self.is_reading_head and self.head_bytes > MAX_HEAD_BYTES and not self.transport.is_closing():
            self.send_431_response()

    def send_400_response(self, msg: str) -> None:
        if not self.head_problem:  # every other malformed request keeps uvicorn's plain-text answer
            super().send_400_response(msg)
            return
        self.answer_and_close(b"400 Bad Request", error_body(self.head_problem, "invalid_host"))

    def send_431_response(self) -> None:
        self.answer_and_close(b"431 Request Header Fields Too Large", TOO_LARGE)

    def answer_and_close(self, status: bytes, body: bytes) -> None:
        self.transport.write(
            b"HTTP/1.1 %s\r\ncontent-type: application/json\r\n"
            b"content-length: %d\r\nconnection: close\r\n\r\n%s" % (status, len(body), body)
        )
        self.transport.close()
