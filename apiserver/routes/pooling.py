"""POST /pooling (vLLM): the model's pooled output, whatever the model kind."""

from __future__ import annotations

from apiserver.inputs.prepare import plan_items_request
from apiserver.operation import Operation, Plan, Rows
from apiserver.responses import encode_json, encode_rows, now, response_id
from apiserver.schemas.common import Usage
from apiserver.schemas.pooling import PoolingData, PoolingRequest, PoolingResponse
from apiserver.state import AppState
from poolserve.protocol import TASK_POOL


def parse(request: PoolingRequest, state: AppState) -> Plan[PoolingRequest]:
    return plan_items_request(state, request, task=TASK_POOL, endpoint="/pooling", activation=request.activation)


def render(plan: Plan[PoolingRequest], rows: Rows, state: AppState) -> bytes:
    request = plan.context
    vectors = encode_rows(rows, request.encoding_format, request.embed_dtype, request.endianness)
    tokens = plan.prompt_tokens
    return encode_json(
        PoolingResponse(
            id=response_id("pool"),
            created=now(),
            model=state.model_name,
            data=[PoolingData(index=i, data=vector) for i, vector in enumerate(vectors)],
            usage=Usage(prompt_tokens=tokens, total_tokens=tokens),
        )
    )


POOLING = Operation(PoolingRequest, parse, render)
