"""What is written about every request: its id, which server answered, timings, metrics, the access log."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable
from typing import Any

from starlette.responses import Response
from starlette.types import Scope

from apiserver.errors import ErrorStyle, error_response
from apiserver.metrics import MODEL, REQUEST_SECONDS, REQUESTS, SERVER_REQUESTS, series

MAX_REQUEST_ID_LENGTH = 128
# OpenAI's `user` in the access log: ids are short; a long one is cut, not logged whole.
MAX_USER_CHARS = 256
# Per-request timings that routes leave in the request state, sent back as TEI's headers (ms).
TIMING_HEADERS = (
    ("parse_s", b"x-tokenization-time"),
    ("encode_s", b"x-encoding-time"),
    ("queue_s", b"x-queue-time"),
    ("inference_s", b"x-inference-time"),
)

access_logger = logging.getLogger("poolserve.access")


class Telemetry:
    """What the gate (apiserver/connection/gate.py) writes about every request: `x-poolserve-server`, `x-request-id`,
    TEI's timing headers; the count and time of every request by endpoint; the access log when asked."""

    def __init__(self, *, server_index: int, endpoints: Iterable[str], access_log: bool, cache_hits_header: bool):
        self.server_header = (b"x-poolserve-server", str(server_index).encode())
        self.served = SERVER_REQUESTS.labels(server=str(server_index))
        self.endpoints = frozenset(endpoints)
        self.access_log = access_log
        self.cache_hits_header = cache_hits_header

    def headers(self, state: dict[str, Any], request_id: bytes, elapsed: float) -> list[tuple[bytes, bytes]]:
        headers = [self.server_header, (b"x-request-id", request_id)]
        headers.extend(timing_headers(state, elapsed, cache_hits=self.cache_hits_header))
        return headers

    def count(self, scope: Scope, status: int, elapsed: float) -> None:
        """Counted as the answer starts, so a client that has its answer sees it in the next scrape."""
        path = scope["path"]
        endpoint = path if path in self.endpoints else "other"
        state = scope["state"]
        model = state.get(MODEL, "")
        series(REQUESTS, endpoint, str(status), model).inc()
        series(REQUEST_SECONDS, endpoint, model).observe(elapsed)
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


def unprintable_path_refusal(style: ErrorStyle) -> Response:
    """A control character in the (percent-decoded) path names no route and could forge log lines; a route's
    pattern would even match before a final newline (`$`). Refused before anything else reads it."""
    return error_response(400, "The request path holds a control character.", code="invalid_path", style=style)


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
    # Written as bytes directly (`b"%.3f" %`): no str made and encoded for each of up to seven headers.
    headers = [(b"x-total-time", b"%.3f" % (total * 1000))]
    for key, name in TIMING_HEADERS:
        value = state.get(key)
        if isinstance(value, float):
            headers.append((name, b"%.3f" % (value * 1000)))
    tokens = state.get("tokens")
    if isinstance(tokens, int):
        headers.append((b"x-compute-tokens", b"%d" % tokens))
    cached = state.get("cached")
    # Inputs the engine's cache answered (--cache-bytes): only where the operator asks (--cache-hits-header), as
    # it tells a client what others embedded.
    if cache_hits and isinstance(cached, int):
        headers.append((b"x-cache-hits", b"%d" % cached))
    return headers


def is_sane_request_id(value: bytes) -> bool:
    """Short and printable ASCII without spaces: safe to echo into a header and a log line."""
    return 0 < len(value) <= MAX_REQUEST_ID_LENGTH and all(33 <= c < 127 for c in value)
