"""Builds the Starlette application of one API-server process."""

from __future__ import annotations

from importlib.metadata import version

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from apiserver.endpoints import ENDPOINTS
from apiserver.errors import EXCEPTION_HANDLERS
from apiserver.metrics import get_metrics
from apiserver.middleware import RequestTelemetry
from apiserver.openapi import encode_openapi
from apiserver.routes.test_hooks import block_event_loop, loaded_modules
from apiserver.state import AppState


def build_app(state: AppState, *, test_hooks: bool = False) -> Starlette:
    routes = [Route(e.path, e.handler, methods=[e.method]) for e in ENDPOINTS]
    document = encode_openapi(ENDPOINTS, version("poolserve"))

    async def openapi(request: Request) -> Response:
        return Response(document, media_type="application/json")

    routes.append(Route("/openapi.json", openapi, methods=["GET"]))
    routes.append(Route("/metrics", get_metrics, methods=["GET"]))
    if test_hooks:
        routes.append(Route("/_test/modules", loaded_modules, methods=["GET"]))
        routes.append(Route("/_test/block", block_event_loop, methods=["POST"]))
    app = Starlette(
        routes=routes,
        middleware=[
            Middleware(
                RequestTelemetry,
                server_index=state.server_index,
                endpoints=[route.path for route in routes],
                access_log=state.config.access_log,
            )
        ],
        exception_handlers=EXCEPTION_HANDLERS,
    )
    app.state.poolserve = state
    return app
