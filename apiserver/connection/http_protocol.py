"""uvicorn's httptools protocol with a bound on the request line and headers, and connections that retire.

Heads: 431 past MAX_HEAD_BYTES; 400 for an HTTP/1.1 request without exactly one `Host` header.

uvicorn's httptools protocol buffers a request's head, however long, until it ends: a client could send a
header of gigabytes and the body limit (apiserver/connection/body_limit.py) would never see it. This subclass counts
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

Read timeouts (apiserver/connection/read_timeouts.py has the rules): past --header-timeout without a whole head,
a connection that sent part of one gets 408 (`header_timeout`) and is closed, and one that sent
nothing is closed without a word (as an idle keep-alive connection is: a client that just sent its
first request on it would otherwise read a 408 as the answer to it). A body whose bytes stop for
--body-timeout gets 408 (`body_timeout`) and the connection closes; the route reading it sees the
client gone, so it never works on half a body. Each is counted in poolserve_connections_timed_out,
with uvicorn's own keep-alive closes (reason=idle).

Upgrades: poolserve serves no WebSocket, so uvicorn is configured with `ws="none"` (apiserver/process.py).
With a WebSocket library installed (uvicorn[standard] brings one) uvicorn would hand an `Upgrade: websocket`
connection to its WebSocket protocol, whose close this class never sees: the connection's slot in the
server's count (apiserver/connection/fair_accept.py) leaked, and 1,024 upgrade requests filled two servers for good.
An upgrade request is answered as plain HTTP instead (RFC 9110 7.8: a server may ignore Upgrade) and its
connection closes after the answer, since the parser reads nothing on a connection it saw upgraded.

Draining: told to stop (SIGTERM, or SIGHUP's and SIGTTOU's drain), uvicorn closes every idle keep-alive
connection at once. A client that read its last response a moment ago may be sending its next request on
that connection already: it gets the connection closed instead of an answer, a request lost that nothing
could retry (a POST). So here a draining connection answers what it reads with `Connection: close` (a
response in progress ends the connection as uvicorn's would), and an idle one is closed only once it has
been idle for DRAIN_IDLE_S since its last response: a client sending back to back gets its answer and
opens its next connection elsewhere, and a connection idle for longer (a proxy's pool) closes at once.
"""

from __future__ import annotations

import asyncio
import math
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from uvicorn.config import Config as UvicornConfig
from uvicorn.protocols.http.flow_control import FlowControl
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn.server import ServerState

from apiserver.connection.client_gone import client_left
from apiserver.connection.client_share import ClientShare
from apiserver.connection.fair_accept import ServerLoad
from apiserver.connection.read_timeouts import ReadClock
from apiserver.connection.response_writes import ResponseWrites
from apiserver.errors import BODY_TIMED_OUT, OPENAI, ErrorStyle, error_bytes, style_of
from apiserver.metrics import CONNECTIONS_RECYCLED, CONNECTIONS_TIMED_OUT

# Request line and headers together. Browsers, proxies and servers settle around 8 to 64 KiB (nginx reads
# 4 x 8 KiB, Node 16 KiB); a bearer key and a few cookies fit many times over.
MAX_HEAD_BYTES = 64 * 1024

# A draining server closes a keep-alive connection once it has been idle this long since its last response
# (above). A client that sends back to back does so within milliseconds; each idle connection adds at most
# this much to a drain.
DRAIN_IDLE_S = 0.5


TOO_LARGE = error_bytes(
    431,
    f"The request line and headers are larger than this server's limit of {MAX_HEAD_BYTES} bytes.",
    "headers_too_large",
)


@dataclass(frozen=True, slots=True)
class ConnectionPolicy:
    """What every connection of one API server shares: its load count, each client's count, when it retires
    and how long its reads may take (0: never, no limit)."""

    load: ServerLoad
    clients: ClientShare = field(default_factory=lambda: ClientShare(0))
    max_requests: int = 0
    max_age_s: float = 0.0
    header_timeout_s: float = 0.0
    body_timeout_s: float = 0.0
    send_timeout_s: float = 0.0

    def header_timed_out(self) -> bytes:
        return error_bytes(
            408,
            f"The request line and headers did not arrive within {self.header_timeout_s:g} s (--header-timeout).",
            "header_timeout",
        )

    def body_timed_out(self, style: ErrorStyle = OPENAI) -> bytes:
        """In the style of the route that was reading the body (its scope says: apiserver/errors.py)."""
        return error_bytes(
            408,
            f"The request body stopped arriving for {self.body_timeout_s:g} s (--body-timeout).",
            "body_timeout",
            style,
        )


class ReadingFlowControl(FlowControl):
    """uvicorn's flow control, which also tells the protocol each time reading goes on: uvicorn's
    receive() calls resume_reading() whenever a route asks for body, paused or not. The protocol's method is held
    weakly: the protocol holds this flow control, and a strong reference back made each connection a reference cycle
    that only the cyclic collector frees (tests/in_process/test_reference_cycles.py)."""

    def __init__(self, transport: asyncio.Transport, on_resume: Callable[[bool], None]):
        super().__init__(transport)
        self.on_resume = weakref.WeakMethod(on_resume)

    def resume_reading(self) -> None:
        was_paused = self.read_paused
        super().resume_reading()
        on_resume = self.on_resume()
        if on_resume is not None:
            on_resume(was_paused)


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
    has_received = False
    read_timer: asyncio.TimerHandle | None = None
    send_timer: asyncio.TimerHandle | None = None
    read_timer_at = math.inf
    is_draining = False
    is_between_requests = True  # no request of this connection read in part, in flight or unanswered

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
        self.idle_since = self.opened_at
        self.is_counted = True  # the acceptor counted this connection when it accepted it (and its client's share)
        self.client_host = ""
        self.clock = ReadClock(policy.header_timeout_s, policy.body_timeout_s, self.opened_at)

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        peer = transport.get_extra_info("peername")
        self.client_host = str(peer[0]) if isinstance(peer, tuple) and peer else ""
        self.flow = ReadingFlowControl(transport, self.on_reading_resumed)
        self.arm_read_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        cycle = self.cycle
        if cycle is not None and not cycle.response_complete:
            # A request waiting on the engine drops its work (apiserver/connection/client_gone.py).
            client_left(cycle.scope)
        super().connection_lost(exc)
        for timer in (self.read_timer, self.send_timer):
            if timer is not None:
                timer.cancel()
        self.read_timer = self.send_timer = None
        if self.is_counted:
            self.is_counted = False
            self.policy.clients.release(self.client_host)
            self.policy.load.connection_closed()

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self.is_between_requests = False
        self.is_reading_head = True
        self.head_bytes = 0
        self.clock.head_started(self.loop.time())
        self.arm_read_timer()

    def on_headers_complete(self) -> None:
        self.is_reading_head = False
        self.head_problem = host_problem(self.parser.get_http_version(), self.headers)
        if self.head_problem:
            raise InvalidHead(self.head_problem)
        super().on_headers_complete()
        # A request without a body reaches on_message_complete within this same parse.
        self.clock.body_started(self.loop.time())
        self.arm_read_timer()
        self.requests_read += 1
        cycle = self.cycle
        if cycle is None:
            return
        # A new cycle: its answer's head and body go in one send. Not for HEAD, whose answer has no body write to
        # carry the head: held, it would wait for the connection's next answer.
        if cycle.transport is self.transport and cycle.scope["method"] != "HEAD":
            cycle.transport = ResponseWrites(self.transport, cycle)
        if not cycle.keep_alive:
            return
        if self.parser.should_upgrade():
            # Served as plain HTTP (module docstring, "Upgrades"); the parser reads nothing after it.
            cycle.keep_alive = False
            return
        # Read when the response starts: it then says `Connection: close` and the transport closes after it.
        if self.is_draining:
            cycle.keep_alive = False
            return
        reason = self.retirement_reason()
        if reason:
            cycle.keep_alive = False
            CONNECTIONS_RECYCLED.labels(server=self.policy.load.label, reason=reason).inc()

    def retirement_reason(self) -> str:
        policy = self.policy
        if policy.max_requests and self.requests_read >= policy.max_requests:
            return "requests"
        if policy.max_age_s and self.loop.time() - self.opened_at >= policy.max_age_s:
            return "age"
        return ""

    def on_body(self, body: bytes) -> None:
        self.clock.body_read(self.loop.time())
        super().on_body(body)

    def on_message_complete(self) -> None:
        self.clock.request_read()
        super().on_message_complete()
        # All of the request is in: read on (a body past uvicorn's high-water mark left reading paused), so a
        # client that leaves while its answer is computed is seen at once (apiserver/connection/client_gone.py).
        # uvicorn's receive() does the same for a route waiting on it; a request pipelined behind this one pauses it
        # again.
        if self.flow.read_paused:
            self.flow.resume_reading()

    # Read timeouts -----------------------------------------------------------------------------

    def is_read_paused(self) -> bool:
        """Whether the client owes nothing now: uvicorn stopped reading, or a `100 Continue` is not sent yet."""
        return self.flow.read_paused or (self.cycle is not None and self.cycle.waiting_for_100_continue)

    def on_reading_resumed(self, was_paused: bool) -> None:
        now = self.loop.time()
        if was_paused:
            self.clock.reading_resumed(now)
        else:  # a route asking for more body
            self.clock.body_read(now)
        self.arm_read_timer()

    def arm_read_timer(self) -> None:
        """One timer per connection, set no later than the clock's deadline; when it fires it looks
        again (reads since then may have moved the deadline on), so a read costs no timer of its own."""
        deadline = self.clock.deadline(is_paused=self.is_read_paused())
        if deadline is None or deadline >= self.read_timer_at:
            return
        if self.read_timer is not None:
            self.read_timer.cancel()
        self.read_timer_at = deadline
        self.read_timer = self.loop.call_at(deadline, self.on_read_timer)

    def on_read_timer(self) -> None:
        self.read_timer = None
        self.read_timer_at = math.inf
        if self.transport.is_closing():
            return
        if self.clock.has_expired(self.loop.time(), is_paused=self.is_read_paused()):
            self.read_timed_out()
        else:
            self.arm_read_timer()

    def read_timed_out(self) -> None:
        phase = self.clock.phase
        self.clock.request_read()  # nothing more is waited for: this connection ends here
        CONNECTIONS_TIMED_OUT.labels(
            server=self.policy.load.label, reason="header" if phase == "head" else "body"
        ).inc()
        cycle = self.cycle
        if phase == "head":
            if cycle is not None and not cycle.response_complete:
                # A pipelined head stalls behind a request not answered yet: no second answer on this
                # connection, it closes once that answer is out.
                cycle.keep_alive = False
            elif self.has_received:
                self.answer_and_close(self.policy.header_timed_out())
            else:
                self.transport.close()
            return
        if cycle.response_started:
            # The route answered without reading the whole body: as above.
            if cycle.response_complete:
                self.transport.close()
            else:
                cycle.keep_alive = False
            return
        # The route waits in receive(): it sees the client gone (Starlette's ClientDisconnect), so it never
        # works on half a body, and the request is counted and logged as the 408 the client got.
        cycle.scope.setdefault("state", {})[BODY_TIMED_OUT] = True
        cycle.disconnected = True
        cycle.message_event.set()
        self.answer_and_close(self.policy.body_timed_out(style_of(cycle.scope)))

    # Writing -----------------------------------------------------------------------------------

    def pause_writing(self) -> None:
        """The socket's buffers are full: the client is not reading. It has --send-timeout to start again, or the
        connection is dropped, with the answer it holds (an unread 16 MB answer stayed in memory for ever)."""
        super().pause_writing()
        if self.policy.send_timeout_s and self.send_timer is None:
            self.send_timer = self.loop.call_later(self.policy.send_timeout_s, self.send_timed_out)

    def resume_writing(self) -> None:
        super().resume_writing()
        if self.send_timer is not None:
            self.send_timer.cancel()
            self.send_timer = None

    def send_timed_out(self) -> None:
        self.send_timer = None
        if self.transport.is_closing():
            return
        CONNECTIONS_TIMED_OUT.labels(server=self.policy.load.label, reason="send").inc()
        self.transport.abort()

    # Draining ----------------------------------------------------------------------------------

    def on_response_complete(self) -> None:
        self.is_between_requests = not self.pipeline  # a pipelined request starts now
        self.idle_since = self.loop.time()
        super().on_response_complete()

    def shutdown(self) -> None:
        """uvicorn calls this on every connection when the server starts to stop (module docstring)."""
        self.is_draining = True
        cycle = self.cycle
        if cycle is not None and not cycle.response_complete:
            cycle.keep_alive = False  # it closes once this response is out
        elif self.is_between_requests:
            self.close_when_idle()
        # Otherwise a head is arriving: on_headers_complete makes its request the connection's last.

    def close_when_idle(self) -> None:
        if self.transport.is_closing() or not self.is_between_requests:
            return
        wait = self.idle_since + DRAIN_IDLE_S - self.loop.time()
        if wait <= 0:
            self.transport.close()
        else:
            self.loop.call_later(wait, self.close_when_idle)

    def timeout_keep_alive_handler(self) -> None:
        if not self.transport.is_closing():
            CONNECTIONS_TIMED_OUT.labels(server=self.policy.load.label, reason="idle").inc()
        super().timeout_keep_alive_handler()

    def data_received(self, data: bytes) -> None:
        self.has_received = True
        if self.is_reading_head:
            self.head_bytes += len(data)
        super().data_received(data)
        if self.is_reading_head and self.head_bytes > MAX_HEAD_BYTES and not self.transport.is_closing():
            self.send_431_response()

    def _unsupported_upgrade_warning(self) -> None:
        """uvicorn logs two WARNING lines per upgrade request (one telling to install a WebSocket library): a
        client could fill the log with them. The request is answered as plain HTTP (module docstring)."""

    def send_400_response(self, msg: str) -> None:
        if not self.head_problem:  # every other malformed request keeps uvicorn's plain-text answer
            super().send_400_response(msg)
            return
        self.answer_and_close(error_bytes(400, self.head_problem, "invalid_host"))

    def send_431_response(self) -> None:
        self.answer_and_close(TOO_LARGE)

    def answer_and_close(self, response: bytes) -> None:
        self.transport.write(response)
        self.transport.close()
