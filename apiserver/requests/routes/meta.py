"""GET /v1/models, /version, /health and /ping: what this server is, and whether it answers."""

from __future__ import annotations

from importlib.metadata import version

from starlette.requests import Request
from starlette.responses import Response

from apiserver.errors import error_response, style_of
from apiserver.requests.responses import json_response
from apiserver.requests.schemas.meta import (
    EngineHealth,
    HealthResponse,
    ModelEntry,
    ModelHealth,
    ModelList,
    VersionResponse,
)
from apiserver.requests.served_models import ServedModels

LIVE = b'{"status":"ok"}'


async def list_models(request: Request) -> Response:
    """Every name of every model served, the default model's first."""
    models: ServedModels = request.app.state.models
    entries = [
        ModelEntry(
            id=name,
            created=state.started_at,
            root=state.card.path,
            max_model_len=state.card.max_model_len,
            kind=state.card.kind,
            tasks=list(state.card.tasks),
            output=state.card.output,
            outputs=list(state.card.outputs),
        )
        for state in models.states
        for name in state.model_names
    ]
    return json_response(ModelList(data=entries))


async def get_version(request: Request) -> Response:
    return json_response(VersionResponse(version("poolserve")))


async def live(request: Request) -> Response:
    """This process answers: its event loop runs. Nothing else is checked, so load cannot starve it."""
    return Response(LIVE, media_type="application/json")


async def ready(request: Request) -> Response:
    """200 when every model's engines answered the background ping lately and are not stuck in one forward pass;
    else 503, naming the model when there are several. Reading the latest answer, not waiting for a new one, keeps
    probes fast under load."""
    models: ServedModels = request.app.state.models
    several = len(models.states) > 1
    healths: dict[str, ModelHealth] = {}
    for state in models.states:
        which = f" of model {state.model_name!r}" if several else ""
        pong = state.engine.latest_pong()
        if pong is None:
            message = f"The model engine{which} is not answering (loading, restarting or down)."
            return error_response(503, message, code="engine_unavailable", style=style_of(request.scope))
        if pong.stalled_for > state.config.engine_stall_limit:
            return error_response(
                503,
                f"The model engine{which} has been inside one forward pass for {pong.stalled_for:.0f}s: it looks hung.",
                code="engine_hung",
                style=style_of(request.scope),
            )
        engine = EngineHealth(
            queued_inputs=pong.queued_inputs, queued_tokens=pong.queued_tokens, busy_seconds=round(pong.stalled_for, 3)
        )
        healths[state.model_name] = ModelHealth(engine=engine, silent_engines=state.engine.silent_engines())
    default = healths[models.default.model_name]
    return json_response(
        HealthResponse(
            status="ok",
            engine=default.engine,
            silent_engines=default.silent_engines,
            models=healths if several else {},
        )
    )
