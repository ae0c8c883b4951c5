"""The request-body size limit (--max-request-bytes), as ASGI middleware: 413 before the body is read or buffered."""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from apiserver.errors import error_response
from apiserver.limits import body_too_large


class BodySizeLimit:
    """A declared Content-Length over the limit is answered at once, unread. A chunked body (no length) is
    counted as it arrives and the request fails with 413 the moment it passes the limit, so no route ever
    buffers more than `limit` bytes."""

    def __init__(self, app: ASGIApp, limit: int):
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = next((value for name, value in scope["headers"] if name == b"content-length"), b"")
        if declared.isdigit() and int(declared) > self.limit:
            error = body_too_large(self.limit, int(declared))
            await error_response(error.status, error.message, code=error.code)(scope, receive, send)
            return
        received = 0

        async def receive_within_limit() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.limit:
                    # Raised inside the route's `await request.body()`; the ApiError handler answers 413.
                    raise body_too_large(self.limit)
            return message

        await self.app(scope, receive_within_limit, send)
