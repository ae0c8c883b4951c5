"""The clock a connection's reads are held to: --header-timeout for a request's head, --body-timeout for its body.

uvicorn times only the idle gap after a response (--keep-alive-timeout): a connection that never
sends a byte, sends half a head, or trickles a body a byte at a time stays open for ever, each one
holding a file descriptor and, for a body, a request's memory. nginx bounds both
(client_header_timeout, client_body_timeout, 60 s each) and so does this clock, with nginx's
meanings:

- head: from the connection's start, or the first byte of a later request on it, to the end of
  the headers, in all. Reads do not restart it, so a head sent a byte at a time still runs out.
- body: the longest gap between two reads of the body, not the whole upload: a large body on a
  slow link is fine as long as bytes keep coming, and the route asking for more starts the gap
  again too. A client waiting on `Expect: 100-continue` owes nothing until the route asks (that
  sends its `100 Continue`).
- none: between a complete request and its answer, and between requests (uvicorn's keep-alive
  timeout has that).

Whenever uvicorn stops reading the socket (flow control: a route holding 64 KiB of body it has not
taken yet, or pipelined requests waiting their turn) the client owes nothing either: the clock
stands still, and starts again from zero when reading resumes.

Pure bookkeeping on the event loop's clock; apiserver/connection/http_protocol.py feeds it events and arms
one timer at `deadline()`.
"""

from __future__ import annotations

from typing import Literal

Phase = Literal["head", "body", "none"]


class ReadClock:
    """What the connection is waiting for and since when; 0 for a timeout turns that one off."""

    def __init__(self, header_timeout: float, body_timeout: float, now: float):
        self.header_timeout = header_timeout
        self.body_timeout = body_timeout
        # A new connection owes its first head from the moment it is accepted.
        self.phase: Phase = "head"
        self.since = now

    def head_started(self, now: float) -> None:
        """The first byte of a request; a head already being waited for keeps its start (the first
        request's clock runs from the accept, not from its first byte)."""
        if self.phase != "head":
            self.phase = "head"
            self.since = now

    def body_started(self, now: float) -> None:
        self.phase = "body"
        self.since = now

    def body_read(self, now: float) -> None:
        """Bytes of the body arrived, or the route asked for more: the gap starts again."""
        if self.phase == "body":
            self.since = now

    def reading_resumed(self, now: float) -> None:
        """The server reads the socket again after a pause: whatever is owed gets its whole time again."""
        self.since = now

    def request_read(self) -> None:
        """The request is all in (or the connection stops reading it): nothing owed until the next one."""
        self.phase = "none"

    def deadline(self, *, is_paused: bool) -> float | None:
        """When the connection times out if nothing changes; None while nothing is owed."""
        if is_paused:
            return None
        if self.phase == "head" and self.header_timeout:
            return self.since + self.header_timeout
        if self.phase == "body" and self.body_timeout:
            return self.since + self.body_timeout
        return None

    def has_expired(self, now: float, *, is_paused: bool) -> bool:
        deadline = self.deadline(is_paused=is_paused)
        return deadline is not None and now >= deadline
