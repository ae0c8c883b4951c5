"""POST /v1/embeddings: OpenAI's embeddings API."""

from __future__ import annotations

import base64

import msgspec
import numpy as np
from starlette.requests import Request
from starlette.responses import Response

from apiserver.embedding_inputs import (
    TokenizedInputs,
    check_model,
    decode_embedding_request,
    tokenize_embedding_request,
)
from apiserver.schemas.embeddings import EmbeddingData, EmbeddingResponse, Usage
from apiserver.state import AppState
from engine_client import PooledResult

_encoder = msgspec.json.Encoder()


def prepare(body: bytes, state: AppState) -> tuple[TokenizedInputs, str]:
    request = decode_embedding_request(body)
    check_model(request.model, state.config.model_names)
    return tokenize_embedding_request(request, state.tokenizer, state.card), request.encoding_format


def encode_response(result: PooledResult, inputs: TokenizedInputs, encoding_format: str, model: str) -> bytes:
    vectors = np.frombuffer(result.data, dtype=result.dtype).reshape(result.rows, result.dim)
    data: list[EmbeddingData]
    if encoding_format == "base64":
        # float32 little-endian bytes, as OpenAI's clients decode them.
        row_bytes = result.dim * vectors.itemsize
        data = [
            EmbeddingData(
                index=i, embedding=base64.b64encode(result.data[i * row_bytes : (i + 1) * row_bytes]).decode()
            )
            for i in range(result.rows)
        ]
    else:
        data = [EmbeddingData(index=i, embedding=row) for i, row in enumerate(vectors.tolist())]
    response = EmbeddingResponse(
        data=data,
        model=model,
        usage=Usage(prompt_tokens=inputs.prompt_tokens, total_tokens=inputs.prompt_tokens),
    )
    return _encoder.encode(response)


async def create_embeddings(request: Request) -> Response:
    state: AppState = request.app.state.poolserve
    body = await request.body()
    inputs, encoding_format = await state.preprocess.run(prepare, body, state)
    result = await state.engine.pool(inputs.lengths, inputs.tokens, inputs.dimensions)
    content = await state.preprocess.run(encode_response, result, inputs, encoding_format, state.model_name)
    return Response(content, media_type="application/json")
