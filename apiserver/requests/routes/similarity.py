"""POST /similarity (TEI): how close each of `sentences` is to `source_sentence`, by the model's similarity
function (the cosine of their embeddings unless its Sentence-Transformers files name another)."""

from __future__ import annotations

import numpy as np

from apiserver.errors import bad_request
from apiserver.requests.inputs.job import build_job
from apiserver.requests.inputs.text import tei_truncation
from apiserver.requests.limits import check_input_count
from apiserver.requests.operation import Operation, Plan, Rows
from apiserver.requests.pair_scores import SIMILARITIES, normalize_for
from apiserver.requests.prompts import named_prompt
from apiserver.requests.responses import encode_json
from apiserver.requests.schemas.tei import SimilarityParameters, SimilarityRequest
from apiserver.requests.state import AppState
from apiserver.requests.validation import require_task
from poolserve.model_card import TASK_EMBED


def parse(request: SimilarityRequest, state: AppState) -> Plan[None]:
    require_task(state.card, TASK_EMBED, "/similarity")
    sentences = request.inputs.sentences
    if not sentences:
        raise bad_request("`inputs.sentences` must not be empty.", param="inputs.sentences", code="empty_input")
    # The source sentence is embedded too: it counts, as in TEI.
    check_input_count(len(sentences) + 1, state.config.max_inputs_per_request, "inputs.sentences")
    parameters = request.parameters or SimilarityParameters()
    prompt = named_prompt(state.card, parameters.prompt_name, "parameters.prompt_name")
    texts = [request.inputs.source_sentence, *sentences]
    params = ["inputs.source_sentence", *(f"inputs.sentences[{i}]" for i in range(len(sentences)))]
    for text, param in zip(texts, params, strict=True):
        if not text:
            raise bad_request(f"`{param}` is an empty string.", param=param)
    truncation = tei_truncation(parameters.truncate, parameters.truncation_direction, state.card)
    job = build_job(
        list(texts), state.card, state.tokenizer, limit=truncation.limit, params=params,
        direction=truncation.direction, option=truncation.option, budget=state.token_budget, prompt=prompt,
    )  # fmt: skip
    job.params.normalize = normalize_for(state.card)
    return Plan(None, job=job)


def render(plan: Plan[None], rows: Rows, state: AppState) -> bytes:
    others = rows[1:]
    source = np.broadcast_to(rows[0], others.shape)
    return encode_json(SIMILARITIES[state.card.similarity](source, others).tolist())


SIMILARITY = Operation(SimilarityRequest, parse, render)
