"""Request bodies: each one's size (--max-request-bytes, 413) and the bytes of all of them that an API server holds
at once (--max-body-bytes-in-flight, 503), both refused before a body is read (the gate,
apiserver/connection/gate.py, asks)."""

from __future__ import annotations

import asyncio

from starlette.responses import Response
from starlette.types import Message, Receive

from apiserver.errors import ApiError, ErrorStyle, error_response
from apiserver.metrics import BODIES_REFUSED, BODY_BYTES_IN_FLIGHT

# The gauge of bytes held is written this long after a change, not at each: two metric-file writes a request
# otherwise, for a figure a scrape reads every few seconds.
GAUGE_DELAY_S = 0.1


def body_too_large(limit: int, size: int | None = None) -> ApiError:
    """--max-request-bytes, said in bytes of body rather than per request."""
    said = f" ({size} bytes)" if size is not None else ""
    return ApiError(
        413,
        f"The request body is larger{said} than this server's limit of {limit} bytes (--max-request-bytes).",
        code="request_too_large",
    )


class BodyBudget:
    """The bytes of request bodies this API server has let in and not let go. A request reserves its
    declared Content-Length before a byte of it is read (a chunked body, its bytes as they arrive) and
    releases it when the request ends: until then Starlette's Request and the route keep the raw bytes,
    so that is when their memory is freed. One per process; the event loop is its only user."""

    def __init__(self, limit: int, server_index: int = 0):
        self.limit = limit
        self.held = 0
        self._gauge = BODY_BYTES_IN_FLIGHT.labels(server=str(server_index))
        self._refused = BODIES_REFUSED.labels(server=str(server_index))
        self._is_gauge_due = False

    def reserve(self, size: int) -> bool:
        """Take `size` bytes, or refuse (and count the refusal) when they would pass the limit."""
        if self.held + size > self.limit:
            self._refused.inc()
            return False
        self.held += size
        self._changed()
        return True

    def release(self, size: int) -> None:
        self.held -= size
        self._changed()

    def _changed(self) -> None:
        if self._is_gauge_due:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no loop (a direct call): written at once
            self._write_gauge()
            return
        self._is_gauge_due = True
        loop.call_later(GAUGE_DELAY_S, self._write_gauge)

    def _write_gauge(self) -> None:
        self._is_gauge_due = False
        self._gauge.set(self.held)

    def refusal(self, size: int) -> ApiError:
        return ApiError(
            503,
            f"This API server is receiving or holding {self.held} bytes of request bodies; {size} more would pass "
            f"its limit of {self.limit} (--max-body-bytes-in-flight). Retry shortly.",
            code="too_many_uploads",
        )


class BodyLimit:
    """A declared Content-Length over the limit is answered 413 at once, unread; one that does not fit the
    server's budget, 503 with Retry-After, unread. A chunked body (no length) is counted as it arrives
    (CountedBody) and the request fails the moment it passes either, so no route ever buffers more than
    `limit` bytes and the server no more than the budget's."""

    def __init__(self, limit: int, budget: BodyBudget):
        self.limit = limit
        self.budget = budget

    def admit(self, declared: int, is_chunked: bool, style: ErrorStyle) -> Response | int:
        """The refusal of a body of `declared` bytes (-1: none declared), or the bytes it now holds of the budget."""
        if declared > self.limit:
            error = body_too_large(self.limit, declared)
            return error_response(error.status, error.message, code=error.code, style=style)
        # A body with no length (chunked) cannot be judged up front: it reserves one byte, so it is refused
        # unread only when the budget is already spent, and the rest of its bytes as they arrive.
        upfront = declared if declared > 0 else int(is_chunked)
        if upfront and not self.budget.reserve(upfront):
            error = self.budget.refusal(upfront)
            return error_response(error.status, error.message, code=error.code, style=style)
        return upfront


class CountedBody:
    """A chunked body's `receive`, counting its bytes against the limits as they arrive. A declared length was
    judged before a byte was read and bounds what the parser delivers: only a chunked body needs this.
    `reserved`: what the request holds of the budget, to be released when it ends."""

    def __init__(self, receive: Receive, limits: BodyLimit, reserved: int):
        self._receive = receive
        self._limits = limits
        self.reserved = reserved
        self.received = 0

    async def receive(self) -> Message:
        message = await self._receive()
        if message["type"] == "http.request":
            limits = self._limits
            self.received += len(message.get("body", b""))
            # Raised inside the route's `await request.body()`; the ApiError handler answers.
            if self.received > limits.limit:
                raise body_too_large(limits.limit)
            if self.received > self.reserved:
                if not limits.budget.reserve(self.received - self.reserved):
                    raise limits.budget.refusal(self.received - self.reserved)
                self.reserved = self.received
        return message
