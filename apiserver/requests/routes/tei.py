"""HuggingFace text-embeddings-inference's POST /embed, /embed_all, /embed_sparse, /predict and GET /info."""

from __future__ import annotations

from importlib.metadata import version

import msgspec
import numpy as np
from starlette.requests import Request
from starlette.responses import Response

from apiserver.errors import ApiError, bad_request
from apiserver.requests.inputs.items import items_from_input
from apiserver.requests.inputs.job import EngineJob, build_job
from apiserver.requests.inputs.text import tei_truncation, tokenize_pairs, tokenize_texts
from apiserver.requests.late_interaction import token_vectors_job
from apiserver.requests.limits import check_input_count
from apiserver.requests.operation import Operation, Plan, Rows
from apiserver.requests.prompts import named_prompt, role_prompt
from apiserver.requests.responses import encode_json, float_json, float_rows, json_response
from apiserver.requests.schemas.tei import (
    ClassifierModelType,
    EmbedAllRequest,
    EmbeddingModelType,
    EmbedRequest,
    EmbedSparseRequest,
    InfoResponse,
    ModelType,
    Prediction,
    PredictRequest,
    ServedModelInfo,
    SparseValue,
)
from apiserver.requests.served_models import ServedModels
from apiserver.requests.sparse import pruned
from apiserver.requests.state import AppState
from apiserver.requests.validation import check_dimensions, require_task
from poolserve.model_card import CLASSIFIER, TASK_CLASSIFY, TASK_EMBED, TASK_EMBED_SPARSE, TASK_SCORE, TASK_TOKEN_EMBED
from poolserve.protocol import PoolingParams


def tei_job(request: EmbedRequest | EmbedAllRequest | EmbedSparseRequest, state: AppState) -> EngineJob:
    """The job of TEI's `inputs` (texts or token ids), truncated as TEI's `truncate` says."""
    prompt = named_prompt(state.card, request.prompt_name)
    items = items_from_input(request.inputs, state.config.max_inputs_per_request, param="inputs")
    truncation = tei_truncation(request.truncate, request.truncation_direction, state.card)
    # (/embed_sparse's request is an EmbedAllRequest too; bge-m3's token vectors are its /embed_all answer only)
    is_embed_all = isinstance(request, EmbedAllRequest) and not isinstance(request, EmbedSparseRequest)
    if isinstance(request, EmbedAllRequest) and is_embed_all and state.card.late_interaction is not None:
        role = request.input_type
        if role is not None and request.prompt_name is not None:
            raise bad_request("Send `input_type` or `prompt_name`, not both: the role picks its own prompt.",
                              param="input_type")  # fmt: skip
        return token_vectors_job(
            items, state.card, state.tokenizer, role, truncation=truncation,
            params=[f"inputs[{k}]" for k in range(len(items))], budget=state.token_budget,
            prompt=None if request.prompt_name is None else prompt,
        )  # fmt: skip
    role = request.input_type if isinstance(request, EmbedAllRequest) else None
    if role is not None:
        prompt = role_prompt(state.card, role)
    return build_job(
        items,
        state.card,
        state.tokenizer,
        limit=truncation.limit,
        params=[f"inputs[{k}]" for k in range(len(items))],
        direction=truncation.direction,
        option=truncation.option,
        budget=state.token_budget,
        prompt=prompt,
        role=role,
    )


def parse_embed(request: EmbedRequest, state: AppState) -> Plan[None]:
    require_task(state.card, TASK_EMBED, "/embed")
    job = tei_job(request, state)
    job.params.dimensions = check_dimensions(request.dimensions, state.card)
    job.params.normalize = request.normalize
    return Plan(None, job=job)


def render_embed(plan: Plan[None], rows: Rows, state: AppState) -> bytes:
    return encode_json(float_rows(rows))


EMBED = Operation(EmbedRequest, parse_embed, render_embed)


def parse_embed_all(request: EmbedAllRequest, state: AppState) -> Plan[None]:
    """Every token's last hidden state, as the model gives it: TEI's /embed_all neither pools nor normalizes. A
    late-interaction model's token vectors are the model's own, normalized where its modules normalize them."""
    require_task(state.card, TASK_TOKEN_EMBED, "/embed_all")
    job = tei_job(request, state)
    job.params.per_token, job.params.normalize = True, None if state.card.late_interaction is not None else False
    return Plan(None, job=job)


def render_embed_all(plan: Plan[None], rows: Rows, state: AppState) -> bytes:
    assert plan.job is not None
    return encode_json([float_json(matrix) for matrix in plan.job.token_outputs(rows)])


EMBED_ALL = Operation(EmbedAllRequest, parse_embed_all, render_embed_all)


def parse_embed_sparse(request: EmbedSparseRequest, state: AppState) -> Plan[EmbedSparseRequest]:
    """A SPLADE model's vectors, or bge-m3's lexical weights, their non-zero entries only; TEI answers any other
    model so (424)."""
    if not state.card.supports(TASK_EMBED_SPARSE):
        raise ApiError(
            400,
            "Backend error: Model is not an embedding model with SPLADE pooling.",
            code="sparse_not_supported",
        )
    job = tei_job(request, state)
    job.params.sparse = True
    return Plan(request, job=job)


def render_embed_sparse(plan: Plan[EmbedSparseRequest], rows: Rows, state: AppState) -> bytes:
    assert plan.sparse is not None
    request = plan.context
    return encode_json(
        [
            [SparseValue(index, value) for index, value in zip(indices.tolist(), values.tolist(), strict=True)]
            for indices, values in pruned(plan.sparse, request.sparse_top_k, request.sparse_threshold)
        ]
    )


EMBED_SPARSE = Operation(EmbedSparseRequest, parse_embed_sparse, render_embed_sparse, takes_sparse=True)

Sequence = str | tuple[str, str]


def predict_sequences(inputs: str | list[str | list[str]]) -> tuple[list[Sequence], bool]:
    """TEI's reading of `inputs`: a text, a [text, text] pair, or a batch of texts and pairs.
    Returns the sequences and whether the request was a batch."""
    if isinstance(inputs, str):
        return [inputs], False
    if len(inputs) == 2 and all(isinstance(item, str) for item in inputs):
        return [(inputs[0], inputs[1])], False  # type: ignore[list-item]
    if not inputs:
        raise bad_request("`inputs` must not be empty.", param="inputs", code="empty_input")
    sequences: list[Sequence] = []
    for i, item in enumerate(inputs):
        if isinstance(item, str):
            sequences.append(item)
        elif len(item) == 1:
            sequences.append(item[0])
        elif len(item) == 2:
            sequences.append((item[0], item[1]))
        else:
            raise bad_request(f"`inputs[{i}]` must be a text or a pair of texts.", param=f"inputs[{i}]")
    return sequences, True


def parse_predict(request: PredictRequest, state: AppState) -> Plan[bool]:
    """The plan's context: whether the request was a batch (a batch gets a list of answers)."""
    require_task(state.card, TASK_CLASSIFY, "/predict")
    sequences, is_batch = predict_sequences(request.inputs)
    check_input_count(len(sequences), state.config.max_inputs_per_request, "inputs")
    for i, sequence in enumerate(sequences):
        if not all(sequence if isinstance(sequence, tuple) else (sequence,)):
            raise bad_request(f"`inputs[{i}]` holds an empty string.", param=f"inputs[{i}]")
    truncation = tei_truncation(request.truncate, request.truncation_direction, state.card)
    limit, direction, option = truncation.limit, truncation.direction, truncation.option
    singles = [(i, s) for i, s in enumerate(sequences) if isinstance(s, str)]
    pairs = [(i, s) for i, s in enumerate(sequences) if isinstance(s, tuple)]
    rows: list[list[int]] = [[] for _ in sequences]
    type_rows: list[list[int]] = [[] for _ in sequences]
    if singles:
        single_rows = tokenize_texts(
            [s for _, s in singles], [f"inputs[{i}]" for i, _ in singles], limit, state.tokenizer, state.card,
            direction=direction, option=option, budget=state.token_budget,
        )  # fmt: skip
        for (i, _), row in zip(singles, single_rows, strict=True):
            rows[i], type_rows[i] = row, [0] * len(row)
    if pairs:
        pair_rows, pair_types = tokenize_pairs(
            [p for _, p in pairs], [f"inputs[{i}]" for i, _ in pairs], limit, state.tokenizer, state.card,
            direction=direction, option=option, budget=state.token_budget,
        )  # fmt: skip
        for (i, _), row, types in zip(pairs, pair_rows, pair_types, strict=True):
            rows[i], type_rows[i] = row, types
    use_types = bool(pairs) and state.card.uses_token_types
    job = EngineJob(
        rows=rows,
        type_rows=type_rows if use_types else None,
        params=PoolingParams(activation=not request.raw_scores),
    )
    return Plan(is_batch, job=job)


def render_predict(plan: Plan[bool], rows: Rows, state: AppState) -> bytes:
    labels = state.card.labels
    predictions = [
        [Prediction(score=float(row[j]), label=labels[j]) for j in np.argsort(-row, kind="stable")] for row in rows
    ]
    return encode_json(predictions if plan.context else predictions[0])


PREDICT = Operation(PredictRequest, parse_predict, render_predict)


# TEI's names for the pooling modes it shares with sentence-transformers (TEI's `Pool`, snake case).
TEI_POOLING = {"lasttoken": "last_token"}


def model_type(state: AppState) -> ModelType:
    card = state.card
    if card.kind != CLASSIFIER:
        return ModelType(embedding=EmbeddingModelType(pooling=TEI_POOLING.get(card.pooling, card.pooling)))
    labels = ClassifierModelType(
        id2label={str(i): label for i, label in enumerate(card.labels)},
        label2id={label: i for i, label in enumerate(card.labels)},
    )
    return ModelType(reranker=labels) if card.supports(TASK_SCORE) else ModelType(classifier=labels)


async def get_info(request: Request) -> Response:
    """The default model's info, as TEI's; with several models, each one's in `models` too."""
    models: ServedModels = request.app.state.models
    state = models.default
    config, card = state.config, state.card
    return json_response(
        InfoResponse(
            model_id=state.model_name,
            served_model_name=state.model_name,
            model_sha=None,
            model_dtype=card.dtype,
            model_type=model_type(state),
            # poolserve sets no cap on concurrent requests; 0 says so.
            max_concurrent_requests=0,
            max_input_length=card.max_model_len,
            max_batch_tokens=card.max_batch_tokens,
            max_batch_requests=card.max_batch_size,
            max_client_batch_size=config.max_inputs_per_request,
            auto_truncate=False,
            tokenization_workers=config.preprocess_workers * config.api_server_count,
            version=version("poolserve"),
            outputs=list(card.outputs),
            models=[model_info(each) for each in models.states] if len(models.states) > 1 else msgspec.UNSET,
        )
    )


def model_info(state: AppState) -> ServedModelInfo:
    card = state.card
    return ServedModelInfo(
        model_id=state.model_name,
        served_model_name=state.model_name,
        model_dtype=card.dtype,
        model_type=model_type(state),
        max_input_length=card.max_model_len,
        max_batch_tokens=card.max_batch_tokens,
        max_batch_requests=card.max_batch_size,
        outputs=list(card.outputs),
    )
