"""JSON responses encoded with msgspec, vectors as floats or base64, and the ids that vLLM-style responses carry."""

from __future__ import annotations

import base64
import time
import uuid

import msgspec
import numpy as np
import numpy.typing as npt
from starlette.responses import Response

from apiserver.vector_bytes import row_bytes

_encoder = msgspec.json.Encoder()


def json_response(content: object, status_code: int = 200) -> Response:
    return Response(_encoder.encode(content), status_code=status_code, media_type="application/json")


def encode_json(content: object) -> bytes:
    return _encoder.encode(content)


def response_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def now() -> int:
    return int(time.time())


def encode_rows(
    rows: npt.NDArray[np.float32], encoding_format: str, embed_dtype: str = "float32", endianness: str = "native"
) -> list[list[float] | str]:
    """Rows as JSON floats, or as base64 of their bytes: float32 in this machine's byte order by default
    (what OpenAI's clients decode), or vLLM's `embed_dtype` and `endianness`. Like vLLM, those two say
    nothing about JSON floats."""
    if encoding_format == "base64":
        return [base64.b64encode(data).decode() for data in row_bytes(rows, embed_dtype, endianness)]
    floats: list[list[float] | str] = rows.tolist()
    return floats
