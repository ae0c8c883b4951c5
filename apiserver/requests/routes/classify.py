"""POST /classify (vLLM): a label and the probabilities of every label, per input."""

from __future__ import annotations

from apiserver.requests.aliases import value_of
from apiserver.requests.inputs.items import items_from_input
from apiserver.requests.inputs.job import build_job
from apiserver.requests.inputs.text import vllm_truncation
from apiserver.requests.inputs.windows import long_input_mode
from apiserver.requests.operation import Operation, Plan, Rows
from apiserver.requests.responses import encode_json, now, response_id
from apiserver.requests.schemas.classify import ClassifyData, ClassifyRequest, ClassifyResponse
from apiserver.requests.schemas.common import Usage
from apiserver.requests.state import AppState
from apiserver.requests.validation import check_model, require_task
from poolserve.model_card import TASK_CLASSIFY


def parse(request: ClassifyRequest, state: AppState) -> Plan[None]:
    check_model(request.model, state.model_names)
    require_task(state.card, TASK_CLASSIFY, "/classify")
    items = items_from_input(request.input, state.config.max_inputs_per_request)
    # --long-input truncate cuts here too; chunk does not apply (a class is not combined from windows): a long
    # input is then refused, as by default.
    truncate, _ = long_input_mode(None, request.truncate_prompt_tokens, state.config)
    truncation = vllm_truncation(truncate, state.card, request.truncation_side)
    activation = value_of(use_activation=request.use_activation, activation=request.activation)
    job = build_job(
        items, state.card, state.tokenizer, limit=truncation.limit, direction=truncation.direction,
        budget=state.token_budget, add_special_tokens=request.add_special_tokens,
    )  # fmt: skip
    job.params.activation = activation is not False
    return Plan(None, job=job)


def render(plan: Plan[None], rows: Rows, state: AppState) -> bytes:
    labels = state.card.labels
    data = [
        ClassifyData(index=i, label=labels[int(row.argmax())], probs=row.tolist(), num_classes=len(labels))
        for i, row in enumerate(rows)
    ]
    tokens = plan.prompt_tokens
    return encode_json(
        ClassifyResponse(
            id=response_id("classify"),
            created=now(),
            model=state.model_name,
            data=data,
            usage=Usage(prompt_tokens=tokens, total_tokens=tokens),
        )
    )


CLASSIFY = Operation(ClassifyRequest, parse, render)
