"""Request bodies, as ASGI middleware: each one's size (--max-request-bytes, 413) and the bytes of all of them
that an API server holds at once (--max-body-bytes-in-flight, 503), both refused before a body is read."""

from __future__ import annotations

import asyncio

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from apiserver.errors import ApiError, error_response, style_of
from apiserver.limits import body_too_large
from apiserver.metrics import BODIES_REFUSED, BODY_BYTES_IN_FLIGHT

# The gauge of bytes held is written this long after a change, not at each: two metric-file writes a request
# otherwise, for a figure a scrape reads every few seconds.
GAUGE_DELAY_S = 0.1


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


class BodySizeLimit:
    """A declared Content-Length over the limit is answered 413 at once, unread; one that does not fit the
    server's budget, 503 with Retry-After, unread. A chunked body (no length) is counted as it arrives and
    the request fails the moment it passes either, so no route ever buffers more than `limit` bytes and the
    server no more than the budget's."""

    def __init__(self, app: ASGIApp, limit: int, budget: BodyBudget):
        self.app = app
        self.limit = limit
        self.budget = budget

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = -1
        is_chunked = False
        for name, value in scope["headers"]:
            if name == b"content-length" and value.isdigit():
                declared = int(value)
            elif name == b"transfer-encoding":
                is_chunked = True
        if declared > self.limit:
            error = body_too_large(self.limit, declared)
            await error_response(error.status, error.message, code=error.code, style=style_of(scope))(
                scope, receive, send
            )
            return
        # A body with no length (chunked) cannot be judged up front: it reserves one byte, so it is refused
        # unread only when the budget is already spent, and the rest of its bytes as they arrive.
        upfront = declared if declared > 0 else int(is_chunked)
        if upfront and not self.budget.reserve(upfront):
            error = self.budget.refusal(upfront)
            await error_response(error.status, error.message, code=error.code, style=style_of(scope))(
                scope, receive, send
            )
            return
        reserved = upfront
        received = 0

        async def receive_within_limits() -> Message:
            nonlocal received, reserved
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                # Raised inside the route's `await request.body()`; the ApiError handler answers.
                if received > self.limit:
                    raise body_too_large(self.limit)
                if received > reserved:  # only a chunked body: a declared length bounds what arrives
                    if not self.budget.reserve(received - reserved):
                        raise self.budget.refusal(received - reserved)
                    reserved = received
            return message

        try:
            # A declared length was judged above and bounds what the parser delivers: only a chunked body is counted.
            await self.app(scope, receive_within_limits if is_chunked else receive, send)
        finally:
            self.budget.release(reserved)
