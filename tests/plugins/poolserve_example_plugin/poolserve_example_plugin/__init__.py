"""A poolserve plugin: POST /example/nearest embeds a query and candidates and names the nearest."""

from __future__ import annotations

import msgspec
import numpy as np

from apiserver.plugins import (
    AppState,
    EngineJob,
    Operation,
    Plan,
    Plugin,
    PoolingParams,
    Rows,
    bad_request,
    check_input_count,
    encode_json,
    tokenize_texts,
)


class NearestRequest(msgspec.Struct, kw_only=True):
    query: str
    candidates: list[str]


class NearestResponse(msgspec.Struct, kw_only=True):
    index: int
    scores: list[float]


def parse(request: NearestRequest, state: AppState) -> Plan[None]:
    """Runs on the preprocessing pool: check, tokenize, and ask for normalized vectors."""
    if not request.candidates:
        raise bad_request("`candidates` must not be empty.", param="candidates")
    check_input_count(len(request.candidates), state.config.max_inputs_per_request, "candidates")
    texts = [request.query, *request.candidates]
    params = ["query", *(f"candidates[{i}]" for i in range(len(request.candidates)))]
    rows = tokenize_texts(texts, params, None, state.tokenizer, state.card)
    return Plan(None, job=EngineJob(rows=rows, params=PoolingParams(normalize=True)))


def render(plan: Plan[None], rows: Rows, state: AppState) -> bytes:
    """Runs on the preprocessing pool: cosine of the query (row 0) with each candidate."""
    scores = rows[1:] @ rows[0]
    return encode_json(NearestResponse(index=int(np.argmax(scores)), scores=scores.tolist()))


PLUGIN = Plugin(
    path="/example/nearest",
    operation=Operation(NearestRequest, parse, render),
    summary="The candidate nearest the query, by the cosine of their embeddings.",
    response=NearestResponse,
)
