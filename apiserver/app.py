"""Builds the ASGI application of one API-server process: the gate in front of a Starlette app."""

from __future__ import annotations

import os
from collections.abc import Sequence
from importlib.metadata import version
from typing import TYPE_CHECKING, cast

from starlette.applications import Starlette
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import ASGIApp
from uvicorn.middleware.proxy_headers import ProxyHeadersMiddleware

from apiserver.connection.auth import ApiKey, open_paths
from apiserver.connection.body_limit import BodyBudget, BodyLimit
from apiserver.connection.gate import Gate, Handler, Wrapper
from apiserver.connection.telemetry import Telemetry
from apiserver.connection.tracing import TraceRequests
from apiserver.errors import EXCEPTION_HANDLERS
from apiserver.metrics import get_metrics
from apiserver.requests.endpoints import ENDPOINTS, Endpoint, model_endpoints
from apiserver.requests.limits import body_bytes_in_flight_limit, request_body_limit
from apiserver.requests.openapi import encode_openapi
from apiserver.requests.served_models import ServedModels
from apiserver.requests.state import AppState
from poolserve.config import Config

if TYPE_CHECKING:
    from apiserver.connection.request_tracer import RequestTracer


def build_app(state: AppState, extra_endpoints: Sequence[Endpoint] = (), models: ServedModels | None = None) -> Gate:
    """The app serving the built-in endpoints and `extra_endpoints` (plugins'), all in /openapi.json: the gate
    (apiserver/connection/gate.py) in front of a Starlette app that answers what has no exact route. `state`: the
    default model's; `models`: every model served, when several (apiserver/requests/served_models.py)."""
    models = models or ServedModels([state])
    endpoints = [*ENDPOINTS, *model_endpoints(state.card), *extra_endpoints]
    config = state.config
    key_free = open_paths(protect_metrics=config.protect_metrics) if config.api_key else None
    document = encode_openapi(endpoints, version("poolserve"), key_free)

    async def openapi(request: Request) -> Response:
        return Response(document, media_type="application/json")

    handlers = handlers_of(endpoints)
    handlers["/openapi.json"] = {"GET": openapi}
    handlers["/metrics"] = {"GET": get_metrics}
    app = Starlette(routes=routes_of(handlers), exception_handlers=EXCEPTION_HANDLERS)
    app.state.poolserve = state
    app.state.models = models
    # One limit for the server: the largest any of its models takes (a model of images takes more).
    body_limit = max(request_body_limit(model.config, model.card) for model in models.states)
    exempt = open_paths(protect_metrics=config.protect_metrics)
    return Gate(
        app,
        {(method, path): handler for path, methods in handlers.items() for method, handler in methods.items()},
        telemetry=Telemetry(
            server_index=state.server_index,
            endpoints=handlers,
            access_log=config.access_log,
            cache_hits_header=config.cache_hits_header,
        ),
        load=state.load,
        bodies=BodyLimit(body_limit, BodyBudget(body_bytes_in_flight_limit(config, body_limit), state.server_index)),
        key=ApiKey(config.api_key, exempt) if config.api_key else None,
        error_styles={e.path: e.error_style for e in endpoints},
        exception_handlers=EXCEPTION_HANDLERS,
        # uvicorn's own rewrite of the client's address and scheme from a trusted proxy's X-Forwarded-* headers, its
        # variable and default (apiserver/process.py turns uvicorn's off: only Starlette's redirects read them).
        fallback=cast(
            ASGIApp,
            ProxyHeadersMiddleware(app, trusted_hosts=os.environ.get("FORWARDED_ALLOW_IPS", "127.0.0.1,::1")),  # type: ignore[arg-type]
        ),
        wrapper=wrapper_of(config, state.tracer),
    )


def handlers_of(endpoints: Sequence[Endpoint]) -> dict[str, dict[str, Handler]]:
    """Each path's handler by method."""
    handlers: dict[str, dict[str, Handler]] = {}
    for endpoint in endpoints:
        handlers.setdefault(endpoint.path, {})[endpoint.method] = endpoint.route_handler()
    return handlers


def routes_of(handlers: dict[str, dict[str, Handler]]) -> list[Route]:
    """One route per path, so that a path served with several methods (`/`: GET and POST) answers any
    other method with a 405 whose `Allow` lists them all."""
    return [Route(path, by_method(methods), methods=list(methods)) for path, methods in handlers.items()]


def by_method(handlers: dict[str, Handler]) -> Handler:
    if len(handlers) == 1:
        return next(iter(handlers.values()))

    async def dispatch(request: Request) -> Response:
        # Starlette adds HEAD to a route that has GET.
        return await handlers["GET" if request.method == "HEAD" else request.method](request)

    return dispatch


def wrapper_of(config: Config, tracer: RequestTracer | None) -> Wrapper | None:
    """What wraps the gate's checks: CORS outside, then the request's trace span (inside the request telemetry,
    whose request id goes on the span, and outside the key and body checks, whose refusals are traced too)."""
    cors = cors_of(config)
    if tracer is None:
        return cors

    def wrap(app: ASGIApp) -> ASGIApp:
        traced = TraceRequests(app, tracer=tracer)
        return traced if cors is None else cors(traced)

    return wrap


def cors_of(config: Config) -> Wrapper | None:
    """CORS, when origins are allowed: it answers browsers' preflights (which never carry a key) before the key
    is checked, and the key is checked before a byte of the body is read."""
    if not config.cors_allowed_origins:
        return None
    origins = config.cors_allowed_origins

    def wrap(app: ASGIApp) -> ASGIApp:
        return CORSMiddleware(
            app,
            allow_origins=origins,
            allow_methods=["GET", "POST"],
            allow_headers=["authorization", "content-type", "x-request-id"],
            expose_headers=["x-request-id", "x-poolserve-server"],
            # The key travels in a header the page sets; no cookies are involved.
            allow_credentials=False,
            max_age=600,
        )

    return wrap
