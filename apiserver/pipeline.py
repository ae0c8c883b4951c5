"""Running an engine job, turning its rows back into the request's order, and the whole request cycle."""

from __future__ import annotations

import base64
from collections.abc import Callable
from typing import TypeVar

import numpy as np
import numpy.typing as npt
from starlette.requests import Request
from starlette.responses import Response

from apiserver.inputs.job import EngineJob, check_total_tokens
from apiserver.inputs.prepare import PreparedJob, finish_job
from apiserver.state import AppState

F32 = npt.NDArray[np.float32]
Parsed = TypeVar("Parsed")


async def run_job(state: AppState, job: EngineJob) -> F32:
    """The job's output rows, one per request input, in the request's order."""
    check_total_tokens(job, state.config.max_tokens_per_request)
    request, frames = job.to_wire()
    result = await state.engine.pool(request, frames)
    rows = np.frombuffer(result.data, dtype=result.dtype).reshape(result.rows, result.dim)
    return rows if job.order is None else rows[job.order]


def encode_rows(rows: F32, encoding_format: str) -> list[list[float] | str]:
    """Rows as JSON floats, or as base64 of their little-endian float32 bytes (what OpenAI's clients decode)."""
    if encoding_format == "base64":
        data = np.ascontiguousarray(rows, dtype="<f4")
        return [base64.b64encode(row.tobytes()).decode() for row in data]
    floats: list[list[float] | str] = rows.tolist()
    return floats


async def answer_items_request(
    request: Request,
    prepare: Callable[[bytes, AppState], tuple[Parsed, PreparedJob]],
    encode: Callable[[F32, Parsed, int, str], bytes],
) -> Response:
    """Decode and prepare on the preprocessing pool, fetch remote images, run, encode on the pool."""
    state: AppState = request.app.state.poolserve
    parsed, prepared = await state.preprocess.run(prepare, await request.body(), state)
    job = await finish_job(state, prepared)
    rows = await run_job(state, job)
    content = await state.preprocess.run(encode, rows, parsed, job.prompt_tokens, state.model_name)
    return Response(content, media_type="application/json")
