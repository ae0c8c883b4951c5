"""POST /score (vLLM) and POST /rerank, /v1/rerank, /v2/rerank (Jina, Cohere, vLLM; TEI when it sends `texts`)."""

from __future__ import annotations

import msgspec
from starlette.requests import Request
from starlette.responses import Response

from apiserver.errors import bad_request
from apiserver.inputs.text import resolve_token_limit
from apiserver.pipeline import preprocess_body, run_job
from apiserver.responses import json_response, now, response_id
from apiserver.schemas.common import Usage
from apiserver.schemas.scoring import (
    RerankDocument,
    RerankRequest,
    RerankResponse,
    RerankResult,
    RerankUsage,
    ScoreData,
    ScoreRequest,
    ScoreResponse,
    TeiRank,
)
from apiserver.scoring import ScorePlan, plan_scores
from apiserver.state import AppState
from apiserver.tokenizer import Direction
from apiserver.validation import check_model, decode_body, require_task
from poolserve.protocol import TASK_SCORE

_score_decoder = msgspec.json.Decoder(ScoreRequest)
_rerank_decoder = msgspec.json.Decoder(RerankRequest)


def as_texts(value: str | list[str], param: str) -> list[str]:
    texts = [value] if isinstance(value, str) else value
    if not texts:
        raise bad_request(f"`{param}` must not be empty.", param=param)
    for i, text in enumerate(texts):
        if not text:
            raise bad_request(f"`{param}[{i}]` is an empty string.", param=f"{param}[{i}]")
    return texts


def score_pairs(request: ScoreRequest, max_pairs: int) -> tuple[list[tuple[str, str]], list[str]]:
    """vLLM's pairing: one text_1 against every text_2, or text_1[i] with text_2[i]."""
    first, second = as_texts(request.text_1, "text_1"), as_texts(request.text_2, "text_2")
    if len(first) == 1:
        first = first * len(second)
    elif len(first) != len(second):
        raise bad_request(
            f"`text_1` has {len(first)} texts and `text_2` {len(second)}: send one text_1, or as many as text_2.",
            param="text_1",
        )
    if len(second) > max_pairs:
        raise bad_request(f"{len(second)} pairs; at most {max_pairs} are allowed per request.", param="text_2")
    return list(zip(first, second, strict=True)), [f"text_2[{i}]" for i in range(len(second))]


def prepare_score(body: bytes, state: AppState) -> tuple[ScoreRequest, ScorePlan]:
    request = decode_body(body, _score_decoder)
    check_model(request.model, state.model_names)
    require_task(state.card, TASK_SCORE, "/score")
    pairs, params = score_pairs(request, state.config.max_inputs_per_request)
    limit = resolve_token_limit(request.truncate_prompt_tokens, state.card)
    plan = plan_scores(pairs, params, state.card, state.tokenizer, limit=limit, activation=request.activation)
    return request, plan


async def create_score(request: Request) -> Response:
    state: AppState = request.app.state.poolserve
    _, plan = await preprocess_body(request, prepare_score)
    scores = plan.scores(await run_job(request, plan.job))
    tokens = plan.job.prompt_tokens
    return json_response(
        ScoreResponse(
            id=response_id("score"),
            created=now(),
            model=state.model_name,
            data=[ScoreData(index=i, score=score) for i, score in enumerate(scores)],
            usage=Usage(prompt_tokens=tokens, total_tokens=tokens),
        )
    )


def documents_of(request: RerankRequest, max_documents: int) -> list[str]:
    if (request.documents is None) == (request.texts is None):
        raise bad_request("Send exactly one of `documents` and `texts`.", param="documents")
    param = "documents" if request.documents is not None else "texts"
    given = request.documents if request.documents is not None else request.texts
    assert given is not None
    documents = [doc.text if isinstance(doc, RerankDocument) else doc for doc in given]
    if not documents:
        raise bad_request(f"`{param}` must not be empty.", param=param)
    if len(documents) > max_documents:
        raise bad_request(
            f"`{param}` has {len(documents)} documents; at most {max_documents} are allowed per request.",
            param=param,
        )
    for i, document in enumerate(documents):
        if not document:
            raise bad_request(f"`{param}[{i}]` is an empty string.", param=f"{param}[{i}]")
    return documents


def prepare_rerank(body: bytes, state: AppState) -> tuple[RerankRequest, list[str], ScorePlan]:
    request = decode_body(body, _rerank_decoder)
    check_model(request.model, state.model_names)
    require_task(state.card, TASK_SCORE, "rerank")
    if not request.query:
        raise bad_request("`query` is an empty string.", param="query")
    documents = documents_of(request, state.config.max_inputs_per_request)
    param = "texts" if request.texts is not None else "documents"
    pairs = [(request.query, document) for document in documents]
    params = [f"{param}[{i}]" for i in range(len(documents))]
    if request.texts is not None:  # TEI's options
        limit = state.card.max_model_len if request.truncate else None
        direction: Direction = "left" if request.truncation_direction.lower() == "left" else "right"
        plan = plan_scores(
            pairs, params, state.card, state.tokenizer, limit=limit, activation=not request.raw_scores,
            direction=direction, option="truncate",
        )  # fmt: skip
    else:
        limit = resolve_token_limit(request.truncate_prompt_tokens, state.card)
        plan = plan_scores(pairs, params, state.card, state.tokenizer, limit=limit)
    return request, documents, plan


async def create_rerank(request: Request) -> Response:
    state: AppState = request.app.state.poolserve
    parsed, documents, plan = await preprocess_body(request, prepare_rerank)
    scores = plan.scores(await run_job(request, plan.job))
    ranking = sorted(range(len(scores)), key=lambda i: -scores[i])
    if parsed.top_n:
        ranking = ranking[: parsed.top_n]
    if parsed.texts is not None:
        text = parsed.return_text
        return json_response([TeiRank(index=i, score=scores[i], text=documents[i] if text else None) for i in ranking])
    tokens = plan.job.prompt_tokens
    return json_response(
        RerankResponse(
            id=response_id("rerank"),
            model=state.model_name,
            usage=RerankUsage(prompt_tokens=tokens, total_tokens=tokens),
            results=[
                RerankResult(
                    index=i,
                    relevance_score=scores[i],
                    document=RerankDocument(documents[i]) if parsed.return_documents else None,
                )
                for i in ranking
            ],
        )
    )
