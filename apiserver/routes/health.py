"""GET /health and /ping: 200 when this process and the engine both answer, 503 otherwise."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from apiserver.errors import error_response
from apiserver.state import AppState

ENGINE_PING_TIMEOUT_S = 2.0
OK = b'{"status":"ok"}'


async def health(request: Request) -> Response:
    state: AppState = request.app.state.poolserve
    if await state.engine.ping(ENGINE_PING_TIMEOUT_S):
        return Response(OK, media_type="application/json")
    return error_response(503, "The model engine is not answering.", code="engine_unavailable")
