"""ASGI middleware that watches every request: ids, which server answered, timings, metrics, access log."""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Iterable, Mapping

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from apiserver.errors import ERROR_STYLE, OPENAI, ErrorStyle, error_response
from apiserver.fair_accept import ServerLoad
from apiserver.metrics import REQUEST_SECONDS, REQUESTS, SERVER_REQUESTS, series

MAX_REQUEST_ID_LENGTH = 128
# OpenAI's `user` in the access log: ids are short; a long one is cut, not logged whole.
MAX_USER_CHARS = 256
# Per-request timings that routes leave in the request state, sent back as TEI's headers (ms).
TIMING_HEADERS = (
    ("preprocess_s", b"x-tokenization-time"),
    ("encode_s", b"x-encoding-time"),
    ("queue_s", b"x-queue-time"),
    ("inference_s", b"x-inference-time"),
)

access_logger = logging.getLogger("poolserve.access")


class RequestTelemetry:
    """Adds `x-poolserve-server`, `x-request-id` (the client's, when it sent a sane one), TEI's
    timing headers; counts and times every request by endpoint; writes the access log when asked; keeps
    the server's count of requests in flight (fair accept reads it). Records the endpoint's error style
    (`error_styles`, by path) in the request's state first, so whatever fails after answers in it."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        server_index: int,
        endpoints: Iterable[str],
        load: ServerLoad,
        access_log: bool = False,
        error_styles: Mapping[str, ErrorStyle] | None = None,
        cache_hits_header: bool = False,
    ):
        self.app = app
        self.load = load
        self.server = str(server_index)
        self.server_header = (b"x-poolserve-server", self.server.encode())
        self.served = SERVER_REQUESTS.labels(server=self.server)
        self.endpoints = frozenset(endpoints)
        self.access_log = access_log
        self.error_styles = dict(error_styles or {})
        self.cache_hits_header = cache_hits_header

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.monotonic()
        request_id = next((value for name, value in scope["headers"] if name == b"x-request-id"), b"")
        if not is_sane_request_id(request_id):
            request_id = os.urandom(16).hex().encode()  # uuid4().hex's 32 hex digits, without the UUID object
        state = scope.setdefault("state", {})
        state["request_id"] = request_id.decode()
        state["started"] = started
        state[ERROR_STYLE] = self.error_styles.get(scope["path"], OPENAI)
        is_counted = False
        # A control character in the (percent-decoded) path names no route and could forge log lines; a route's
        # pattern would even match before a final newline (`$`). Refused before anything else reads it.
        app = self.app if scope["path"].isprintable() else refuse_unprintable_path

        def count(status: int) -> None:
            """Counted as the answer starts, so a client that has its answer sees it in the next scrape."""
            nonlocal is_counted
            is_counted = True
            elapsed = time.monotonic() - started
            path = scope["path"]
            endpoint = path if path in self.endpoints else "other"
            series(REQUESTS, endpoint, str(status)).inc()
            series(REQUEST_SECONDS, endpoint).observe(elapsed)
            self.served.inc()
            if self.access_log:
                access_logger.info(
                    "request_id=%s method=%s path=%s status=%d duration_ms=%.1f tokens=%d%s",
                    state["request_id"],
                    scope["method"],
                    printable(path),
                    status,
                    elapsed * 1000,
                    state.get("tokens", 0),
                    user_field(state.get("user")),
                )

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = [*message.get("headers", []), self.server_header, (b"x-request-id", request_id)]
                headers.extend(timing_headers(state, time.monotonic() - started, cache_hits=self.cache_hits_header))
                message["headers"] = headers
                count(message["status"])
            await send(message)

        self.load.request_started()
        try:
            await app(scope, receive, send_with_headers)
        finally:
            self.load.request_finished()
            if not is_counted:  # the app raised; Starlette's outermost handler answers 500
                count(500)


async def refuse_unprintable_path(scope: Scope, receive: Receive, send: Send) -> None:
    response = error_response(400, "The request path holds a control character.", code="invalid_path")
    await response(scope, receive, send)


def printable(text: str) -> str:
    """`text` with every character that is not printable backslash-escaped, so no value can break a log line."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text)


def user_field(user: object) -> str:
    """OpenAI's `user` (an end-user id, for abuse monitoring) as the access log shows it: JSON-quoted, so
    no id can forge a log line, and cut to MAX_USER_CHARS."""
    if not isinstance(user, str):
        return ""
    return " user=" + json.dumps(user[:MAX_USER_CHARS])


def timing_headers(state: dict[str, object], total: float, *, cache_hits: bool = False) -> list[tuple[bytes, bytes]]:
    headers = [(b"x-total-time", f"{total * 1000:.3f}".encode())]
    for key, name in TIMING_HEADERS:
        value = state.get(key)
        if isinstance(value, float):
            headers.append((name, f"{value * 1000:.3f}".encode()))
    tokens = state.get("tokens")
    if isinstance(tokens, int):
        headers.append((b"x-compute-tokens", str(tokens).encode()))
    cached = state.get("cached")
    # Inputs the engine's cache answered (--cache-bytes): only where the operator asks (--cache-hits-header), as
    # it tells a client what others embedded.
    if cache_hits and isinstance(cached, int):
        headers.append((b"x-cache-hits", str(cached).encode()))
    return headers


def is_sane_request_id(value: bytes) -> bool:
    """Short and printable ASCII without spaces: safe to echo into a header and a log line."""
    return 0 < len(value) <= MAX_REQUEST_ID_LENGTH and all(33 <= c < 127 for c in value)
