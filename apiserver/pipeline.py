"""Running an engine job and turning the engine's rows back into the request's order."""

from __future__ import annotations

import base64

import numpy as np
import numpy.typing as npt

from apiserver.inputs.job import EngineJob
from engine_client import EngineClient

F32 = npt.NDArray[np.float32]


async def run_job(engine: EngineClient, job: EngineJob) -> F32:
    """The job's output rows, one per request input, in the request's order."""
    request, frames = job.to_wire()
    result = await engine.pool(request, frames)
    rows = np.frombuffer(result.data, dtype=result.dtype).reshape(result.rows, result.dim)
    return rows if job.order is None else rows[job.order]


def encode_rows(rows: F32, encoding_format: str) -> list[list[float] | str]:
    """Rows as JSON floats, or as base64 of their little-endian float32 bytes (what OpenAI's clients decode)."""
    if encoding_format == "base64":
        data = np.ascontiguousarray(rows, dtype="<f4")
        return [base64.b64encode(row.tobytes()).decode() for row in data]
    floats: list[list[float] | str] = rows.tolist()
    return floats
