"""POST /score (vLLM) and POST /rerank, /v1/rerank, /v2/rerank (Jina, Cohere, vLLM; TEI when it sends `texts`)."""

from __future__ import annotations

from dataclasses import dataclass

from apiserver.errors import bad_request
from apiserver.inputs.text import tei_truncation, vllm_truncation
from apiserver.limits import check_input_count
from apiserver.operation import Operation, Plan, Rows
from apiserver.responses import encode_json, now, response_id
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
from apiserver.validation import check_model, require_task
from poolserve.protocol import TASK_SCORE


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
    check_input_count(len(second), max_pairs, "text_2")
    return list(zip(first, second, strict=True)), [f"text_2[{i}]" for i in range(len(second))]


def parse_score(request: ScoreRequest, state: AppState) -> Plan[ScorePlan]:
    check_model(request.model, state.model_names)
    require_task(state.card, TASK_SCORE, "/score")
    pairs, params = score_pairs(request, state.config.max_inputs_per_request)
    truncation = vllm_truncation(request.truncate_prompt_tokens, state.card)
    scoring = plan_scores(
        pairs,
        params,
        state.card,
        state.tokenizer,
        truncation=truncation,
        activation=request.activation,
        budget=state.token_budget,
    )
    return Plan(scoring, job=scoring.job)


def render_score(plan: Plan[ScorePlan], rows: Rows, state: AppState) -> bytes:
    scores = plan.context.scores(rows)
    tokens = plan.prompt_tokens
    return encode_json(
        ScoreResponse(
            id=response_id("score"),
            created=now(),
            model=state.model_name,
            data=[ScoreData(index=i, score=score) for i, score in enumerate(scores)],
            usage=Usage(prompt_tokens=tokens, total_tokens=tokens),
        )
    )


SCORE = Operation(ScoreRequest, parse_score, render_score)


@dataclass(frozen=True, slots=True)
class Reranking:
    """What rendering a rerank answer needs: the request, its documents' texts, and their scoring."""

    request: RerankRequest
    documents: list[str]
    scoring: ScorePlan


def documents_of(request: RerankRequest, max_documents: int) -> list[str]:
    if (request.documents is None) == (request.texts is None):
        raise bad_request("Send exactly one of `documents` and `texts`.", param="documents")
    param = "documents" if request.documents is not None else "texts"
    given = request.documents if request.documents is not None else request.texts
    assert given is not None
    documents = [doc.text if isinstance(doc, RerankDocument) else doc for doc in given]
    if not documents:
        raise bad_request(f"`{param}` must not be empty.", param=param)
    check_input_count(len(documents), max_documents, param)
    for i, document in enumerate(documents):
        if not document:
            raise bad_request(f"`{param}[{i}]` is an empty string.", param=f"{param}[{i}]")
    return documents


def parse_rerank(request: RerankRequest, state: AppState) -> Plan[Reranking]:
    check_model(request.model, state.model_names)
    require_task(state.card, TASK_SCORE, "rerank")
    if not request.query:
        raise bad_request("`query` is an empty string.", param="query")
    documents = documents_of(request, state.config.max_inputs_per_request)
    is_tei = request.texts is not None
    param = "texts" if is_tei else "documents"
    pairs = [(request.query, document) for document in documents]
    params = [f"{param}[{i}]" for i in range(len(documents))]
    if is_tei:  # TEI's options
        truncation = tei_truncation(request.truncate, request.truncation_direction, state.card)
        activation = not request.raw_scores
    else:
        truncation, activation = vllm_truncation(request.truncate_prompt_tokens, state.card), True
    scoring = plan_scores(
        pairs,
        params,
        state.card,
        state.tokenizer,
        truncation=truncation,
        activation=activation,
        budget=state.token_budget,
    )
    return Plan(Reranking(request, documents, scoring), job=scoring.job)


def render_rerank(plan: Plan[Reranking], rows: Rows, state: AppState) -> bytes:
    request, documents = plan.context.request, plan.context.documents
    scores = plan.context.scoring.scores(rows)
    ranking = sorted(range(len(scores)), key=lambda i: -scores[i])
    if request.top_n:
        ranking = ranking[: request.top_n]
    if request.texts is not None:
        text = request.return_text
        return encode_json([TeiRank(index=i, score=scores[i], text=documents[i] if text else None) for i in ranking])
    tokens = plan.prompt_tokens
    return encode_json(
        RerankResponse(
            id=response_id("rerank"),
            model=state.model_name,
            usage=RerankUsage(prompt_tokens=tokens, total_tokens=tokens),
            results=[
                RerankResult(
                    index=i,
                    relevance_score=scores[i],
                    document=RerankDocument(documents[i]) if request.return_documents else None,
                )
                for i in ranking
            ],
        )
    )


RERANK = Operation(RerankRequest, parse_rerank, render_rerank)
