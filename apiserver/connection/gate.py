"""The one ASGI layer in front of the endpoints: each request's id, telemetry, API key and body limits, then its
endpoint by exact (method, path), or Starlette's router for anything else.

A request used to cross eleven ASGI layers before its endpoint ran (uvicorn's proxy headers, Starlette's error
and exception middlewares, our telemetry, key and body-limit middlewares, the router trying each route's regex,
the route's request wrapper and its own exception handler): ~12% of an API server's CPU on a one-sentence
request, ~7% after this (docs/benchmarks.md, "The API server, step 3"). Here the headers are read once, the
endpoint is one dict lookup, and the exceptions the app maps (apiserver/errors.py) are mapped in the same
frame. What has no exact route (an unknown path: 404; a wrong method: 405 with `Allow`; HEAD; a trailing
slash's redirect) goes on to the Starlette app, which answers it as before, behind uvicorn's X-Forwarded-*
rewrite of the client's address and scheme (the redirect's URL reads them; no endpoint does).
"""

from __future__ import annotations

import os
import random
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from apiserver.connection.auth import ApiKey
from apiserver.connection.body_limit import BodyLimit, CountedBody
from apiserver.connection.fair_accept import ServerLoad
from apiserver.connection.telemetry import Telemetry, is_sane_request_id, unprintable_path_refusal
from apiserver.errors import ERROR_STYLE, OPENAI, ErrorStyle

# What the gate calls for a request it lets through: the endpoint's handler (built by
# apiserver/requests/request_cycle.py).
Handler = Callable[[Request], Awaitable[Response]]

ExceptionHandler = Callable[[Request, Exception], Awaitable[Response]]
# Wraps the gate's own checks and dispatch in another ASGI layer (CORS: it answers browsers' preflights, which
# never carry a key, before the key is checked).
Wrapper = Callable[[ASGIApp], ASGIApp]


class Gate:
    """`app`: the Starlette app (what `request.app` is to an endpoint; it answers what `routes` lacks, through
    `fallback` when given). `routes`: the handler of each exact (method, path). `error_styles`: each path's
    error shape, recorded in the request's state before anything can fail."""

    def __init__(
        self,
        app: ASGIApp,
        routes: Mapping[tuple[str, str], Handler],
        *,
        telemetry: Telemetry,
        load: ServerLoad,
        bodies: BodyLimit,
        key: ApiKey | None = None,
        error_styles: Mapping[str, ErrorStyle] | None = None,
        exception_handlers: Mapping[Any, ExceptionHandler] | None = None,
        fallback: ASGIApp | None = None,
        wrapper: Wrapper | None = None,
    ):
        self.app = app
        self.routes = dict(routes)
        self.telemetry = telemetry
        self.load = load
        self.bodies = bodies
        self.key = key
        self.error_styles = dict(error_styles or {})
        self.exception_handlers: dict[Any, ExceptionHandler] = dict(exception_handlers or {})
        self.fallback = fallback or app
        self.wrapped = None if wrapper is None else wrapper(self.checked)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.fallback(scope, receive, send)
            return
        started = time.monotonic()
        request_id = b""
        for name, value in scope["headers"]:
            if name == b"x-request-id":
                request_id = value
                break
        if not is_sane_request_id(request_id):
            request_id = new_request_id()
        state = scope.setdefault("state", {})
        state["request_id"] = request_id.decode()
        state["started"] = started
        state[ERROR_STYLE] = self.error_styles.get(scope["path"], OPENAI)
        telemetry = self.telemetry
        is_counted = False

        async def send_with_headers(message: Message) -> None:
            nonlocal is_counted
            if message["type"] == "http.response.start":
                elapsed = time.monotonic() - started
                message["headers"] = [*message.get("headers", ()), *telemetry.headers(state, request_id, elapsed)]
                is_counted = True
                telemetry.count(scope, message["status"], elapsed)
            await send(message)

        self.load.request_started()
        try:
            if not scope["path"].isprintable():
                await unprintable_path_refusal(state[ERROR_STYLE])(scope, receive, send_with_headers)
            elif self.wrapped is None:
                await self.checked(scope, receive, send_with_headers)
            else:
                await self.wrapped(scope, receive, send_with_headers)
        finally:
            self.load.request_finished()
            if not is_counted:  # the app raised; uvicorn answers 500
                telemetry.count(scope, 500, time.monotonic() - started)

    async def checked(self, scope: Scope, receive: Receive, send: Send) -> None:
        """The key, then the body's size, each refused before a byte of the body is read; then the endpoint."""
        path: str = scope["path"]
        style: ErrorStyle = scope["state"][ERROR_STYLE]
        authorization = None
        declared = -1
        is_chunked = False
        for name, value in scope["headers"]:
            if name == b"content-length":
                if value.isdigit():
                    declared = int(value)
            elif name == b"transfer-encoding":
                is_chunked = True
            elif name == b"authorization" and authorization is None:
                authorization = value
        if self.key is not None and (refusal := self.key.refusal(path, authorization, style)) is not None:
            await refusal(scope, receive, send)
            return
        admitted = self.bodies.admit(declared, is_chunked, style)
        if isinstance(admitted, Response):
            await admitted(scope, receive, send)
            return
        counted = CountedBody(receive, self.bodies, admitted) if is_chunked else None
        try:
            await self.dispatch(scope, receive if counted is None else counted.receive, send)
        finally:
            self.bodies.budget.release(admitted if counted is None else counted.reserved)

    async def dispatch(self, scope: Scope, receive: Receive, send: Send) -> None:
        handler = self.routes.get((scope["method"], scope["path"]))
        if handler is None:
            await self.fallback(scope, receive, send)
            return
        scope["app"] = self.app
        request = Request(scope, receive)
        try:
            response = await handler(request)
        except Exception as exc:
            handle = self.exception_handler(type(exc))
            if handle is None:
                raise
            response = await handle(request, exc)
        await response(scope, receive, send)

    def exception_handler(self, kind: type[Exception]) -> ExceptionHandler | None:
        """The handler of the nearest class in `kind`'s MRO, as Starlette looks it up."""
        for cls in kind.__mro__:
            handler = self.exception_handlers.get(cls)
            if handler is not None:
                return handler
        return None


# Request ids come from a generator of the gate's own, seeded from os.urandom: another module seeding the shared
# one (random.seed) cannot make two processes repeat each other's ids. Reseeded in a forked child.
_ids = random.Random()
os.register_at_fork(after_in_child=_ids.seed)


def new_request_id() -> bytes:
    """32 random hex digits, as uuid4().hex has, without a system call each (os.urandom is one): a request id
    names a request in logs, it guards nothing."""
    return b"%032x" % _ids.getrandbits(128)
