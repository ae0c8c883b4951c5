"""ASGI middleware: every response names the API server that answered and carries a request id."""

from __future__ import annotations

import time
import uuid

from starlette.types import ASGIApp, Message, Receive, Scope, Send

MAX_REQUEST_ID_LENGTH = 128


class ResponseHeaders:
    """Adds `x-poolserve-server` and `x-request-id` (the client's, when it sent a sane one)."""

    def __init__(self, app: ASGIApp, server_index: int):
        self.app = app
        self.server_header = (b"x-poolserve-server", str(server_index).encode())

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request_id = next((value for name, value in scope["headers"] if name == b"x-request-id"), b"")
        if not is_sane_request_id(request_id):
            request_id = uuid.uuid4().hex.encode()
        state = scope.setdefault("state", {})
        state["request_id"] = request_id.decode()
        state["started"] = time.monotonic()
        extra = [self.server_header, (b"x-request-id", request_id)]

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), *extra]
            await send(message)

        await self.app(scope, receive, send_with_headers)


def is_sane_request_id(value: bytes) -> bool:
    """Short and printable ASCII without spaces: safe to echo into a header and a log line."""
    return 0 < len(value) <= MAX_REQUEST_ID_LENGTH and all(33 <= c < 127 for c in value)
