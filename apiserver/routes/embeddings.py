"""POST /v1/embeddings: OpenAI's embeddings API, for text and (CLIP-style models) images."""

from __future__ import annotations

from apiserver.inputs.prepare import plan_items_request
from apiserver.operation import Operation, Plan, Rows
from apiserver.responses import encode_json, encode_rows
from apiserver.schemas.common import Usage
from apiserver.schemas.embeddings import EmbeddingData, EmbeddingRequest, EmbeddingResponse
from apiserver.state import AppState
from poolserve.protocol import TASK_EMBED


def parse(request: EmbeddingRequest, state: AppState) -> Plan[EmbeddingRequest]:
    return plan_items_request(state, request, task=TASK_EMBED, endpoint="/v1/embeddings", activation=True)


def render(plan: Plan[EmbeddingRequest], rows: Rows, state: AppState) -> bytes:
    embeddings = encode_rows(rows, plan.context.encoding_format)
    tokens = plan.prompt_tokens
    return encode_json(
        EmbeddingResponse(
            data=[EmbeddingData(index=i, embedding=vector) for i, vector in enumerate(embeddings)],
            model=state.model_name,
            usage=Usage(prompt_tokens=tokens, total_tokens=tokens),
        )
    )


EMBEDDINGS = Operation(EmbeddingRequest, parse, render)
