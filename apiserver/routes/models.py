"""GET /v1/models: the names this server answers to."""

from __future__ import annotations

import msgspec
from starlette.requests import Request
from starlette.responses import Response

from apiserver.state import AppState


class ModelEntry(msgspec.Struct, kw_only=True):
    id: str
    object: str = "model"
    created: int
    owned_by: str = "poolserve"
    root: str
    max_model_len: int


class ModelList(msgspec.Struct, kw_only=True):
    object: str = "list"
    data: list[ModelEntry]


async def list_models(request: Request) -> Response:
    state: AppState = request.app.state.poolserve
    entries = [
        ModelEntry(
            id=name, created=state.started_at, root=state.card.path, max_model_len=state.card.max_model_len
        )
        for name in state.config.model_names
    ]
    return Response(msgspec.json.encode(ModelList(data=entries)), media_type="application/json")
