"""Builds the Starlette application of one API-server process."""

from __future__ import annotations

from collections.abc import Sequence
from importlib.metadata import version

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from apiserver.auth import ApiKeyAuth, open_paths
from apiserver.body_limit import BodyBudget, BodySizeLimit
from apiserver.endpoints import ENDPOINTS, Endpoint, model_endpoints
from apiserver.errors import EXCEPTION_HANDLERS
from apiserver.limits import body_bytes_in_flight_limit, request_body_limit
from apiserver.metrics import get_metrics
from apiserver.middleware import RequestTelemetry
from apiserver.openapi import encode_openapi
from apiserver.request_cycle import Handler
from apiserver.served_models import ServedModels
from apiserver.state import AppState
from apiserver.tracing import TraceRequests
from poolserve.config import Config


def build_app(
    state: AppState, extra_endpoints: Sequence[Endpoint] = (), models: ServedModels | None = None
) -> Starlette:
    """The app serving the built-in endpoints and `extra_endpoints` (plugins'), all in /openapi.json. `state`: the
    default model's; `models`: every model served, when several (apiserver/served_models.py)."""
    models = models or ServedModels([state])
    endpoints = [*ENDPOINTS, *model_endpoints(state.card), *extra_endpoints]
    routes = routes_of(endpoints)
    key_free = open_paths(protect_metrics=state.config.protect_metrics) if state.config.api_key else None
    document = encode_openapi(endpoints, version("poolserve"), key_free)

    async def openapi(request: Request) -> Response:
        return Response(document, media_type="application/json")

    routes.append(Route("/openapi.json", openapi, methods=["GET"]))
    routes.append(Route("/metrics", get_metrics, methods=["GET"]))
    app = Starlette(
        routes=routes,
        middleware=[
            Middleware(
                RequestTelemetry,
                server_index=state.server_index,
                endpoints=[route.path for route in routes],
                access_log=state.config.access_log,
                load=state.load,
                error_styles={e.path: e.error_style for e in endpoints},
                cache_hits_header=state.config.cache_hits_header,
            ),
            *tracing_middleware(state),
            *access_middleware(
                state.config,
                # One limit for the server: the largest any of its models takes (a model of images takes more).
                body_limit=max(request_body_limit(model.config, model.card) for model in models.states),
                server_index=state.server_index,
            ),
        ],
        exception_handlers=EXCEPTION_HANDLERS,
    )
    app.state.poolserve = state
    app.state.models = models
    return app


def routes_of(endpoints: Sequence[Endpoint]) -> list[Route]:
    """One route per path, so that a path served with several methods (`/`: GET and POST) answers any
    other method with a 405 whose `Allow` lists them all."""
    handlers: dict[str, dict[str, Handler]] = {}
    for endpoint in endpoints:
        handlers.setdefault(endpoint.path, {})[endpoint.method] = endpoint.route_handler()
    return [Route(path, by_method(methods), methods=list(methods)) for path, methods in handlers.items()]


def by_method(handlers: dict[str, Handler]) -> Handler:
    if len(handlers) == 1:
        return next(iter(handlers.values()))

    async def dispatch(request: Request) -> Response:
        # Starlette adds HEAD to a route that has GET.
        return await handlers["GET" if request.method == "HEAD" else request.method](request)

    return dispatch


def tracing_middleware(state: AppState) -> list[Middleware]:
    """Inside the request telemetry (its request id goes on the span) and outside the key and body checks (their
    refusals are traced too); none when tracing is off."""
    if state.tracer is None:
        return []
    return [Middleware(TraceRequests, tracer=state.tracer)]


def access_middleware(config: Config, *, body_limit: int, server_index: int = 0) -> list[Middleware]:
    """Outermost first: CORS answers browsers' preflights (which never carry a key) before the key is
    checked, and the key is checked before a byte of the body is read."""
    middleware = []
    if config.cors_allowed_origins:
        middleware.append(
            Middleware(
                CORSMiddleware,
                allow_origins=config.cors_allowed_origins,
                allow_methods=["GET", "POST"],
                allow_headers=["authorization", "content-type", "x-request-id"],
                expose_headers=["x-request-id", "x-poolserve-server"],
                # The key travels in a header the page sets; no cookies are involved.
                allow_credentials=False,
                max_age=600,
            )
        )
    if config.api_key:
        exempt = open_paths(protect_metrics=config.protect_metrics)
        middleware.append(Middleware(ApiKeyAuth, api_key=config.api_key, exempt=exempt))
    budget = BodyBudget(body_bytes_in_flight_limit(config, body_limit), server_index)
    middleware.append(Middleware(BodySizeLimit, limit=body_limit, budget=budget))
    return middleware
