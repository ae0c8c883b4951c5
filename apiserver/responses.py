"""JSON responses encoded with msgspec, and the ids that vLLM-style responses carry."""

from __future__ import annotations

import time
import uuid

import msgspec
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
