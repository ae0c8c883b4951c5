"""GET /v1/models, /version, /health and /ping: what this server is, and whether it answers."""

from __future__ import annotations

from importlib.metadata import version

from starlette.requests import Request
from starlette.responses import Response

from apiserver.errors import error_response
from apiserver.responses import json_response
from apiserver.schemas.meta import HealthResponse, ModelEntry, ModelList, VersionResponse
from apiserver.state import AppState

ENGINE_PING_TIMEOUT_S = 2.0


async def list_models(request: Request) -> Response:
    state: AppState = request.app.state.poolserve
    entries = [
        ModelEntry(id=name, created=state.started_at, root=state.card.path, max_model_len=state.card.max_model_len)
        for name in state.model_names
    ]
    return json_response(ModelList(data=entries))


async def get_version(request: Request) -> Response:
    return json_response(VersionResponse(version("poolserve")))


async def health(request: Request) -> Response:
    """200 when this process and the engine both answer (a timed round trip), 503 otherwise."""
    state: AppState = request.app.state.poolserve
    if await state.engine.ping(ENGINE_PING_TIMEOUT_S):
        return json_response(HealthResponse("ok"))
    return error_response(503, "The model engine is not answering.", code="engine_unavailable")
