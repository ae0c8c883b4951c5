"""The gate (apiserver/connection/gate.py): what has no exact route still gets Starlette's answers, with the gate's
headers."""

from __future__ import annotations

import asyncio
from typing import Any

from starlette.types import Message


def test_head_and_a_trailing_slash_are_answered_by_the_router_with_the_request_id(serve: Any) -> None:
    served = serve()
    head = served.client.head("/health", headers={"x-request-id": "probe-1"})
    assert (head.status_code, head.content, head.headers["x-request-id"]) == (200, b"", "probe-1")
    assert head.headers["x-poolserve-server"] == "0"
    moved = served.client.get("/v1/models/", follow_redirects=False)
    assert moved.status_code == 307 and moved.headers["location"] == "http://testserver/v1/models"


def test_a_redirect_behind_a_trusted_proxy_keeps_the_scheme_it_was_asked_in(serve: Any) -> None:
    """uvicorn's X-Forwarded-* rewrite is off in uvicorn (apiserver/process.py); the gate applies it where it is
    read."""
    gate = serve().client.app
    sent: list[Message] = []

    async def receive() -> Message:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: Message) -> None:
        sent.append(message)

    scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "GET", "scheme": "http",
        "path": "/v1/models/", "raw_path": b"/v1/models/", "query_string": b"", "root_path": "",
        "client": ("127.0.0.1", 40000), "server": ("127.0.0.1", 8000),
        "headers": [
            (b"host", b"api.example.com"), (b"x-forwarded-proto", b"https"), (b"x-forwarded-for", b"203.0.113.9"),
        ],
    }  # fmt: skip
    asyncio.run(gate(scope, receive, send))
    headers = dict(sent[0]["headers"])
    assert sent[0]["status"] == 307
    assert headers[b"location"] == b"https://api.example.com/v1/models"
