"""Builds the Starlette application of one API-server process."""

from __future__ import annotations

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.routing import Route

from apiserver.errors import EXCEPTION_HANDLERS
from apiserver.middleware import ResponseHeaders
from apiserver.routes.embeddings import create_embeddings
from apiserver.routes.health import health
from apiserver.routes.models import list_models
from apiserver.routes.test_hooks import loaded_modules
from apiserver.state import AppState


def build_app(state: AppState, *, test_hooks: bool = False) -> Starlette:
    routes = [
        Route("/v1/embeddings", create_embeddings, methods=["POST"]),
        Route("/v1/models", list_models, methods=["GET"]),
        Route("/health", health, methods=["GET"]),
        Route("/ping", health, methods=["GET"]),
    ]
    if test_hooks:
        routes.append(Route("/_test/modules", loaded_modules, methods=["GET"]))
    app = Starlette(
        routes=routes,
        middleware=[Middleware(ResponseHeaders, server_index=state.server_index)],
        exception_handlers=EXCEPTION_HANDLERS,
    )
    app.state.poolserve = state
    return app
