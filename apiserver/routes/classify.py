"""POST /classify (vLLM): a label and the probabilities of every label, per input."""

from __future__ import annotations

import msgspec
from starlette.requests import Request
from starlette.responses import Response

from apiserver.inputs.items import items_from_input
from apiserver.inputs.job import EngineJob, build_job
from apiserver.inputs.text import resolve_token_limit
from apiserver.pipeline import preprocess_body, run_job
from apiserver.responses import json_response, now, response_id
from apiserver.schemas.classify import ClassifyData, ClassifyRequest, ClassifyResponse
from apiserver.schemas.common import Usage
from apiserver.state import AppState
from apiserver.validation import check_model, decode_body, require_task
from poolserve.protocol import TASK_CLASSIFY

_decoder = msgspec.json.Decoder(ClassifyRequest)


def prepare(body: bytes, state: AppState) -> EngineJob:
    request = decode_body(body, _decoder)
    check_model(request.model, state.model_names)
    require_task(state.card, TASK_CLASSIFY, "/classify")
    items = items_from_input(request.input, state.config.max_inputs_per_request)
    limit = resolve_token_limit(request.truncate_prompt_tokens, state.card)
    job = build_job(items, state.card, state.tokenizer, limit=limit)
    job.activation = request.activation
    return job


async def create_classification(request: Request) -> Response:
    state: AppState = request.app.state.poolserve
    job = await preprocess_body(request, prepare)
    rows = await run_job(request, job)
    labels = state.card.labels
    data = [
        ClassifyData(index=i, label=labels[int(row.argmax())], probs=row.tolist(), num_classes=len(labels))
        for i, row in enumerate(rows)
    ]
    tokens = job.prompt_tokens
    return json_response(
        ClassifyResponse(
            id=response_id("classify"),
            created=now(),
            model=state.model_name,
            data=data,
            usage=Usage(prompt_tokens=tokens, total_tokens=tokens),
        )
    )
