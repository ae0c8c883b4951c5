"""API-key authentication: which paths need `Authorization: Bearer <key>`, and the check the gate
(apiserver/connection/gate.py) makes before a byte of the body is read."""

from __future__ import annotations

import hashlib
import hmac

from starlette.responses import Response

from apiserver.errors import ErrorStyle, error_response

# Paths anyone may call without a key: load balancers' and orchestrators' probes carry no credentials.
# Everything else, unknown paths included, needs the key (deny by default).
OPEN_PATHS = frozenset({"/health", "/health/ready", "/health/live", "/ping"})
# Open too unless --protect-metrics: Prometheus scrapers are usually set up without credentials.
METRICS_PATH = "/metrics"


def open_paths(*, protect_metrics: bool) -> frozenset[str]:
    return OPEN_PATHS if protect_metrics else OPEN_PATHS | {METRICS_PATH}


def digest(secret: bytes) -> bytes:
    """Keys are compared as fixed-length digests, so the comparison's time says nothing about their length."""
    return hashlib.sha256(secret).digest()


def bearer_token(authorization: bytes) -> bytes | None:
    scheme, _, token = authorization.strip().partition(b" ")
    if scheme.lower() != b"bearer":
        return None
    return token.strip()


class ApiKey:
    """Refuses a request to any path outside `exempt` unless it carries the key as a Bearer token (401)."""

    def __init__(self, api_key: str, exempt: frozenset[str]):
        self.exempt = exempt
        self._digest = digest(api_key.encode())

    def refusal(self, path: str, authorization: bytes | None, style: ErrorStyle) -> Response | None:
        """The 401 for a request to `path` whose `Authorization` header is `authorization`; None when it may pass."""
        if path in self.exempt or self.is_authorized(authorization):
            return None
        return error_response(
            401,
            "A valid API key is required: send it as `Authorization: Bearer <key>`.",
            code="invalid_api_key",
            headers={"www-authenticate": "Bearer"},
            style=style,
        )

    def is_authorized(self, authorization: bytes | None) -> bool:
        token = bearer_token(authorization) if authorization is not None else None
        # compare_digest takes the same time wherever the first differing byte is.
        return token is not None and hmac.compare_digest(digest(token), self._digest)
