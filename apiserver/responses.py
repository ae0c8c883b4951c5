"""JSON responses encoded with msgspec, vectors as floats or base64, and the ids that vLLM-style responses carry."""

from __future__ import annotations

import base64
import time
import uuid

import msgspec
import numpy as np
import numpy.typing as npt
from starlette.responses import Response

_encoder = msgspec.json.Encoder()


def json_response(content: object, status_code: int = 200) -> Response:
    return Response(_encoder.encode(content), status_code=status_code, media_type="application/json")


def encode_json(content: object) -> bytes:
    return _encoder.encode(content)


def response_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def now() -> int:
    return int(time.time())


def encode_rows(rows: npt.NDArray[np.float32], encoding_format: str) -> list[list[float] | str]:
    """Rows as JSON floats, or as base64 of their little-endian float32 bytes (what OpenAI's clients decode)."""
    if encoding_format == "base64":
        data = np.ascontiguousarray(rows, dtype="<f4")
        return [base64.b64encode(row.tobytes()).decode() for row in data]
    floats: list[list[float] | str] = rows.tolist()
    return floats
