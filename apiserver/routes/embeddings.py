"""POST /v1/embeddings: OpenAI's embeddings API, for text and (CLIP-style models) images."""

from __future__ import annotations

import msgspec
from starlette.requests import Request
from starlette.responses import Response

from apiserver.inputs.prepare import PreparedJob, prepare_items_request
from apiserver.pipeline import F32, answer_items_request, encode_rows
from apiserver.responses import encode_json
from apiserver.schemas.common import Usage
from apiserver.schemas.embeddings import EmbeddingData, EmbeddingRequest, EmbeddingResponse
from apiserver.state import AppState
from apiserver.validation import decode_body
from poolserve.protocol import TASK_EMBED

_decoder = msgspec.json.Decoder(EmbeddingRequest)


def prepare(body: bytes, state: AppState) -> tuple[EmbeddingRequest, PreparedJob]:
    request = decode_body(body, _decoder)
    return request, prepare_items_request(state, request, task=TASK_EMBED, endpoint="/v1/embeddings", activation=True)


def encode_response(rows: F32, request: EmbeddingRequest, prompt_tokens: int, model: str) -> bytes:
    embeddings = encode_rows(rows, request.encoding_format)
    return encode_json(
        EmbeddingResponse(
            data=[EmbeddingData(index=i, embedding=vector) for i, vector in enumerate(embeddings)],
            model=model,
            usage=Usage(prompt_tokens=prompt_tokens, total_tokens=prompt_tokens),
        )
    )


async def create_embeddings(request: Request) -> Response:
    return await answer_items_request(request, prepare, encode_response)
