"""Errors as HTTP: typed exceptions, their bodies in the route family's style (OpenAI's or TEI's), and the
Starlette handlers that map them.

Each endpoint names its error style in the endpoint table (apiserver/requests/endpoints.py); the outermost
middleware records it in the request's scope before anything can fail, and every answer below reads
it from there, so the routes and middleware never look at paths to choose a shape."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from http import HTTPStatus
from typing import Final, Literal

import msgspec
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response

from apiserver.tei_errors import TeiErrorBody, tei_error
from engine_client import EngineError, EngineOverloaded, EngineUnavailable, PoisonPill

logger = logging.getLogger("poolserve.api")

ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    405: "invalid_request_error",
    408: "invalid_request_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
    431: "invalid_request_error",
    500: "server_error",
    503: "service_unavailable",
    504: "timeout_error",
}


# OpenAI's `{"error": {message, type, param, code}}`, or TEI's `{"error", "error_type"}` with TEI's statuses.
ErrorStyle = Literal["openai", "tei"]
OPENAI: Final = "openai"
TEI: Final = "tei"
# The key in a request's scope state where the middleware records its endpoint's style.
ERROR_STYLE = "error_style"


def style_of(scope: Mapping[str, object]) -> ErrorStyle:
    state = scope.get("state")
    style = state.get(ERROR_STYLE) if isinstance(state, dict) else None
    return TEI if style == TEI else OPENAI


class ErrorDetail(msgspec.Struct):
    message: str
    type: str
    param: str | None
    code: str | None


class ErrorBody(msgspec.Struct):
    error: ErrorDetail


class ClientDisconnected(Exception):
    """The client went away before its answer was ready; nobody reads what is sent."""


class ApiError(Exception):
    """An error with its HTTP status, as the client will see it."""

    def __init__(self, status: int, message: str, *, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        # Set when the request's body chose the style (a TEI body on a route several APIs share).
        self.style: ErrorStyle | None = None


def bad_request(message: str, param: str | None = None, code: str | None = None) -> ApiError:
    return ApiError(400, message, param=param, code=code)


UNKNOWN_FIELD = "Object contains unknown field `"


def from_validation_error(exc: msgspec.ValidationError | msgspec.DecodeError) -> ApiError:
    """Keep msgspec's message, which names the path (`... - at $.input[2]`); lift the path into `param`."""
    message = str(exc)
    if isinstance(exc, msgspec.ValidationError):
        param = None
        if " - at `$." in message:
            param = message.rsplit(" - at `$.", 1)[1].rstrip("`")
        if message.startswith(UNKNOWN_FIELD):
            # A field no peer's shape here defines, or one this server refuses (docs/api.md): named, as OpenAI
            # names it, with its path in `param`.
            name = message[len(UNKNOWN_FIELD) :].split("`", 1)[0]
            param = f"{param}.{name}" if param else name
            return bad_request(f"Unrecognized request argument supplied: {param}", param=param, code="invalid_body")
        return bad_request(message, param=param, code="invalid_body")
    return bad_request(f"The request body is not valid JSON: {message}", code="invalid_json")


_encoder = msgspec.json.Encoder()


def error_response(
    status: int,
    message: str,
    param: str | None = None,
    code: str | None = None,
    *,
    headers: Mapping[str, str] | None = None,
    style: ErrorStyle = OPENAI,
) -> Response:
    status, body = error_body(status, message, param, code, style)
    extra = dict(headers or {})
    if status in (429, 503):
        extra["retry-after"] = "1"
    return Response(body, status_code=status, media_type="application/json", headers=extra)


def error_body(status: int, message: str, param: str | None, code: str | None, style: ErrorStyle) -> tuple[int, bytes]:
    """The status and encoded body of an error in `style` (TEI's style has statuses of its own)."""
    if style == TEI:
        status, error_type = tei_error(status, code)
        return status, _encoder.encode(TeiErrorBody(message, error_type))
    return status, _encoder.encode(
        ErrorBody(ErrorDetail(message, ERROR_TYPES.get(status, "server_error"), param, code))
    )


def error_bytes(status: int, message: str, code: str, style: ErrorStyle = OPENAI) -> bytes:
    """A whole response that closes its connection, for answers written straight to a transport outside
    any route (the HTTP protocol's and the acceptor's own): the body and Retry-After of error_response."""
    status, body = error_body(status, message, None, code, style)
    retry_after = b"retry-after: 1\r\n" if status in (429, 503) else b""
    return (
        b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\n%sconnection: close\r\n\r\n%s"
        % (
            status,
            HTTPStatus(status).phrase.encode(),
            len(body),
            retry_after,
            body,
        )
    )


def request_id(request: Request) -> str:
    return str(getattr(request.state, "request_id", "-"))


async def handle_api_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, ApiError)
    return error_response(exc.status, exc.message, exc.param, exc.code, style=exc.style or style_of(request.scope))


async def handle_http_exception(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    message = exc.detail or HTTPStatus(exc.status_code).phrase
    if exc.status_code == 404:
        message = f"No route for {request.method} {request.url.path}."
    elif exc.status_code == 405:
        message = f"Method {request.method} is not allowed on {request.url.path}."
    # Starlette's 405 carries `allow`, which RFC 9110 requires on it.
    return error_response(exc.status_code, message, headers=exc.headers, style=style_of(request.scope))


async def handle_engine_unavailable(request: Request, exc: Exception) -> Response:
    logger.warning("request %s: engine unavailable: %s", request_id(request), exc)
    return error_response(
        503, f"The model engine is unavailable: {exc}.", code="engine_unavailable", style=style_of(request.scope)
    )


async def handle_engine_overloaded(request: Request, exc: Exception) -> Response:
    return error_response(
        429, f"The server is busy: {exc}. Retry shortly.", code="overloaded", style=style_of(request.scope)
    )


async def handle_engine_error(request: Request, exc: Exception) -> Response:
    logger.error("request %s failed in the engine: %s", request_id(request), exc)
    code = "poison_pill" if isinstance(exc, PoisonPill) else "engine_error"
    return error_response(500, f"The model engine failed this request: {exc}", code=code, style=style_of(request.scope))


# Set in the request's state by the HTTP protocol when it answered 408 because the body stalled
# (--body-timeout): the route then sees the connection gone, as for a client that left.
BODY_TIMED_OUT = "body_timed_out"


async def handle_client_disconnected(request: Request, exc: Exception) -> Response:
    if getattr(request.state, BODY_TIMED_OUT, False):
        # The client got that 408; this answer, like a 499's, goes nowhere and only counts and logs it.
        logger.info("request %s: its body stalled past --body-timeout; answered 408", request_id(request))
        return Response(status_code=408)
    # 499, as nginx logs it: the client closed the connection; this answer goes nowhere.
    logger.info("request %s: client disconnected; its work was dropped", request_id(request))
    return Response(status_code=499)


EXCEPTION_HANDLERS = {
    ApiError: handle_api_error,
    HTTPException: handle_http_exception,
    EngineUnavailable: handle_engine_unavailable,
    EngineOverloaded: handle_engine_overloaded,
    EngineError: handle_engine_error,
    ClientDisconnected: handle_client_disconnected,
    # Starlette's own, raised when the client closes the connection while a route reads the body.
    ClientDisconnect: handle_client_disconnected,
}
