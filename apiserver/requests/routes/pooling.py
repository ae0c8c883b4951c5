"""POST /pooling (vLLM): the model's pooled output, whatever the model kind, or what vLLM's `task` asks for."""

from __future__ import annotations

from typing import Any, Final

import numpy as np

from apiserver.errors import bad_request
from apiserver.requests.inputs.prepare import plan_items_request
from apiserver.requests.operation import Operation, Plan, Rows
from apiserver.requests.prompts import role_prompt
from apiserver.requests.responses import encode_json, encode_rows, float_json, now, response_id
from apiserver.requests.schemas.common import Usage
from apiserver.requests.schemas.pooling import PoolingData, PoolingRequest, PoolingResponse, PoolingTask
from apiserver.requests.schemas.tei import SparseValue
from apiserver.requests.sparse import pruned, refuse_pruning_of_dense
from apiserver.requests.state import AppState
from poolserve.model_card import SPARSE, TASK_CLASSIFY, TASK_EMBED, TASK_EMBED_SPARSE, TASK_POOL, TASK_TOKEN_EMBED, Task

# vLLM's tasks poolserve runs, and the card task each needs.
TASKS: Final[dict[PoolingTask, Task]] = {
    "embed": TASK_EMBED,
    "classify": TASK_CLASSIFY,
    "token_embed": TASK_TOKEN_EMBED,
    "embed_sparse": TASK_EMBED_SPARSE,
}
# vLLM's others, refused by name with what to use instead.
REFUSED: Final[dict[PoolingTask, str]] = {
    "score": "send pairs to /score or /rerank",
    "token_classify": "poolserve loads no token-classification models (bge-m3's lexical weights: `embed_sparse`)",
    "encode": "vLLM replaced it with `token_embed`",
    "plugin": "poolserve runs no vLLM IO plugins",
}


def parse(request: PoolingRequest, state: AppState) -> Plan[PoolingRequest]:
    task = request.task
    sparse = state.card.kind == SPARSE or task == "embed_sparse"
    refuse_pruning_of_dense(state.card, request.sparse_top_k, request.sparse_threshold, sparse=sparse)
    if sparse and request.encoding_format == "base64":
        raise bad_request(
            "`encoding_format` base64 is for dense vectors; a sparse vector's answer is its non-zero entries.",
            param="encoding_format",
        )
    role = request.input_type
    late = state.card.is_late_interaction
    # Voyage's input_type picks the role's prompt, as on /v1/embeddings; a late-interaction model treats the role.
    prompt = role_prompt(state.card, role) if role is not None and not late else None
    if task is None and late:
        task = "token_embed"  # a late-interaction model's only output
    if task is None:
        return plan_items_request(
            state, request, task=TASK_POOL, endpoint="/pooling", activation=request.activation, prompt=prompt,
            role=role,
        )  # fmt: skip
    if task in REFUSED:
        raise bad_request(
            f"`task` {task!r} is not supported: {REFUSED[task]}.", param="task", code="task_not_supported"
        )
    needed = TASKS[task]
    if not state.card.supports(needed):
        raise bad_request(
            f"`task` {task!r} needs a model that can {needed}; this model ({state.card.architecture}, a "
            f"{state.card.kind} model) serves: {', '.join(state.card.tasks)}.",
            param="task",
            code="task_not_supported",
        )
    per_token = task == "token_embed"
    # vLLM normalizes per-token states unless the request says not to; a late-interaction model's vectors (and
    # bge-m3's ColBERT vectors) are normalized as the model does.
    token_vectors = state.card.late_interaction is not None
    return plan_items_request(
        state, request, task=needed, endpoint="/pooling", activation=request.activation, per_token=per_token,
        normalize_default=True if per_token and not token_vectors else None, prompt=prompt, role=role,
        sparse=task == "embed_sparse" and state.card.kind != SPARSE,
    )  # fmt: skip


def render(plan: Plan[PoolingRequest], rows: Rows, state: AppState) -> bytes:
    request = plan.context
    fmt, dtype, order = request.encoding_format, request.embed_dtype, request.endianness
    data: list[Any]  # per input: a vector, a tokens x dim matrix, base64 of either, or sparse entries
    if plan.sparse is not None:
        data = [
            [SparseValue(index, value) for index, value in zip(indices.tolist(), values.tolist(), strict=True)]
            for indices, values in pruned(plan.sparse, request.sparse_top_k, request.sparse_threshold)
        ]
    elif plan.job is not None and plan.job.params.per_token:
        matrices = plan.job.token_outputs(rows)
        if fmt == "base64":  # each input's tokens x dim values in embed_dtype, row after row, as vLLM sends them
            data = [encode_rows(np.reshape(matrix, (1, -1)), fmt, dtype, order)[0] for matrix in matrices]
        else:
            data = [float_json(matrix) for matrix in matrices]
    else:
        data = encode_rows(rows, fmt, dtype, order)
    tokens = plan.prompt_tokens
    return encode_json(
        PoolingResponse(
            id=response_id("pool"),
            created=now(),
            model=state.model_name,
            data=[PoolingData(index=i, data=vector) for i, vector in enumerate(data)],
            usage=Usage(prompt_tokens=tokens, total_tokens=tokens),
        )
    )


POOLING = Operation(PoolingRequest, parse, render, takes_sparse=True)
