"""JSON responses encoded with msgspec, vectors as floats or base64, and the ids that vLLM-style responses carry."""

from __future__ import annotations

import base64
import time
import uuid
from typing import cast

import msgspec
import numpy as np
import numpy.typing as npt
import orjson
from starlette.responses import Response

from apiserver.requests.vector_bytes import row_bytes

_encoder = msgspec.json.Encoder()


def json_response(content: object, status_code: int = 200) -> Response:
    return Response(_encoder.encode(content), status_code=status_code, media_type="application/json")


class JsonAnswer(Response):
    """A 200 answer of JSON bytes already encoded: the two headers written directly, without the checks
    Starlette's `init_headers` makes for any content and media type (~1.3 µs of every answered request)."""

    media_type = "application/json"

    def __init__(self, content: bytes):
        self.status_code = 200
        self.body = content
        self.background = None
        self.raw_headers = [(b"content-length", b"%d" % len(content)), (b"content-type", b"application/json")]


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
    return float_rows(rows)


def float_rows(rows: npt.NDArray[np.float32]) -> list[list[float] | str]:
    """Each row as a JSON array of its float32 values, each in the shortest decimal form that reads back as the
    same float32 (as TEI and Infinity write them), encoded already: msgspec writes a `Raw` as it is.

    `tolist()` widens each value to a Python float, whose shortest form is a float64's (0.006385671440511942 for
    the float32 0.0063856714): 1.7 x the bytes, and with msgspec twice the CPU of orjson's float32 writer
    (16.8 and 8.6 µs a 384-float row, 0.68 and 0.26 ms for 16 rows: docs/benchmarks.md)."""
    # Typed as the lists the schemas declare (the OpenAPI document is built from them): the JSON is the same.
    return [cast(list[float], float_json(row)) for row in rows]


def float_json(values: npt.NDArray[np.float32]) -> msgspec.Raw:
    """An array of float32 values (nested as its shape is) as JSON, written as `float_rows` says."""
    return msgspec.Raw(orjson.dumps(np.ascontiguousarray(values, dtype=np.float32), option=orjson.OPT_SERIALIZE_NUMPY))
