"""POST /pooling (vLLM): the model's pooled output, whatever the model kind."""

from __future__ import annotations

import msgspec
from starlette.requests import Request
from starlette.responses import Response

from apiserver.inputs.prepare import PreparedJob, prepare_items_request
from apiserver.pipeline import F32, answer_items_request, encode_rows
from apiserver.responses import encode_json, now, response_id
from apiserver.schemas.common import Usage
from apiserver.schemas.pooling import PoolingData, PoolingRequest, PoolingResponse
from apiserver.state import AppState
from apiserver.validation import decode_body
from poolserve.protocol import TASK_POOL

_decoder = msgspec.json.Decoder(PoolingRequest)


def prepare(body: bytes, state: AppState) -> tuple[PoolingRequest, PreparedJob]:
    request = decode_body(body, _decoder)
    return request, prepare_items_request(
        state, request, task=TASK_POOL, endpoint="/pooling", activation=request.activation
    )


def encode_response(rows: F32, request: PoolingRequest, prompt_tokens: int, model: str) -> bytes:
    vectors = encode_rows(rows, request.encoding_format)
    return encode_json(
        PoolingResponse(
            id=response_id("pool"),
            created=now(),
            model=model,
            data=[PoolingData(index=i, data=vector) for i, vector in enumerate(vectors)],
            usage=Usage(prompt_tokens=prompt_tokens, total_tokens=prompt_tokens),
        )
    )


async def create_pooling(request: Request) -> Response:
    return await answer_items_request(request, prepare, encode_response)
