"""POST /score (vLLM) and POST /rerank, /v1/rerank, /v2/rerank (Jina, Cohere, vLLM; TEI when it sends `texts`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from apiserver.errors import TEI, ErrorStyle, bad_request
from apiserver.requests.aliases import one_spelling, value_of
from apiserver.requests.inputs.text import tei_truncation, vllm_truncation
from apiserver.requests.inputs.windows import long_input_mode
from apiserver.requests.limits import check_input_count
from apiserver.requests.operation import Operation, Plan, Rows
from apiserver.requests.pair_scores import ScorePlan, plan_scores
from apiserver.requests.responses import encode_json, now, response_id
from apiserver.requests.schemas.common import Usage
from apiserver.requests.schemas.scoring import (
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
from apiserver.requests.state import AppState
from apiserver.requests.validation import check_model, require_task
from poolserve.model_card import TASK_SCORE


def as_texts(value: str | Sequence[str], param: str) -> list[str]:
    texts = [value] if isinstance(value, str) else list(value)
    if not texts:
        raise bad_request(f"`{param}` must not be empty.", param=param)
    for i, text in enumerate(texts):
        if not text:
            raise bad_request(f"`{param}[{i}]` is an empty string.", param=f"{param}[{i}]")
    return texts


# vLLM's spellings of the two sides, each first side with the second sides it goes with.
SIDE_PAIRS = {"queries": ("documents", "items"), "data_1": ("data_2",), "text_1": ("text_2",)}


def score_sides(request: ScoreRequest) -> tuple[tuple[str, str | Sequence[str]], tuple[str, str | Sequence[str]]]:
    """The two sides and the names they came under, whichever of vLLM's spellings the request used."""
    first = one_spelling(queries=request.queries, data_1=request.data_1, text_1=request.text_1)
    second = one_spelling(
        documents=request.documents, items=request.items, data_2=request.data_2, text_2=request.text_2
    )
    if first is None or second is None:
        missing = "the first side" if first is None else "the second side"
        raise bad_request(
            f"{missing} is missing: send `queries` with `documents` (or `items`), `data_1` with `data_2`, "
            f"or `text_1` with `text_2`.",
            param=("queries" if first is None else SIDE_PAIRS[first[0]][0]),
        )
    if second[0] not in SIDE_PAIRS[first[0]]:
        raise bad_request(
            f"`{first[0]}` goes with `{'` or `'.join(SIDE_PAIRS[first[0]])}`, not `{second[0]}`.", param=second[0]
        )
    return first, second


def score_pairs(request: ScoreRequest, max_pairs: int) -> tuple[list[tuple[str, str]], list[str]]:
    """vLLM's pairing: one first text against every second text, or first[i] with second[i]."""
    (first_name, first_value), (second_name, second_value) = score_sides(request)
    first, second = as_texts(first_value, first_name), as_texts(second_value, second_name)
    if len(first) == 1:
        first = first * len(second)
    elif len(first) != len(second):
        raise bad_request(
            f"`{first_name}` has {len(first)} texts and `{second_name}` {len(second)}: send one {first_name}, "
            f"or as many as {second_name}.",
            param=first_name,
        )
    check_input_count(len(second), max_pairs, second_name)
    return list(zip(first, second, strict=True)), [f"{second_name}[{i}]" for i in range(len(second))]


def parse_score(request: ScoreRequest, state: AppState) -> Plan[ScorePlan]:
    check_model(request.model, state.model_names)
    require_task(state.card, TASK_SCORE, "/score")
    pairs, params = score_pairs(request, state.config.max_inputs_per_request)
    truncate, chunking = long_input_mode(request.long_input, request.truncate_prompt_tokens, state.config)
    truncation = vllm_truncation(truncate, state.card, request.truncation_side)
    activation = value_of(use_activation=request.use_activation, activation=request.activation)
    scoring = plan_scores(
        pairs,
        params,
        state.card,
        state.tokenizer,
        truncation=truncation,
        activation=activation is not False,
        budget=state.token_budget,
        instruction=request.instruction,
        output=request.output,
        chunking=chunking,
        first_param=score_sides(request)[0][0],
    )
    return Plan(scoring, job=scoring.job)


def render_score(plan: Plan[ScorePlan], rows: Rows, state: AppState) -> bytes:
    scores = plan.context.scores(rows if plan.sparse is None else plan.sparse)
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


SCORE = Operation(ScoreRequest, parse_score, render_score, takes_sparse=True)


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
        raise bad_request(f"`{param}` must not be empty.", param=param, code="empty_input")
    check_input_count(len(documents), max_documents, param)
    for i, document in enumerate(documents):
        if not document:
            raise bad_request(f"`{param}[{i}]` is an empty string.", param=f"{param}[{i}]")
    return documents


def refuse_the_other_forms_options(request: RerankRequest, is_tei: bool) -> None:
    """TEI's options in a request that sends `documents`, or the others' in one that sends `texts`, would
    change nothing: refused by name (a value that is the default changes nothing either way)."""
    if is_tei:
        others = {
            "truncate_prompt_tokens": request.truncate_prompt_tokens is not None,
            "truncation_side": request.truncation_side is not None,
            "return_documents": not request.return_documents,
        }
        form, fix = "`documents`", "TEI's form has `truncate`, `truncation_direction` and `return_text`"
    else:
        others = {
            "raw_scores": request.raw_scores,
            "return_text": request.return_text,
            "truncate": request.truncate,
            "truncation_direction": request.truncation_direction.lower() != "right",
        }
        form, fix = (
            "`texts` (TEI's form)",
            "this form has `use_activation`, `truncate_prompt_tokens` and `return_documents`",
        )
    for name, is_set in others.items():
        if is_set:
            raise bad_request(f"`{name}` is for requests that send {form}; {fix}.", param=name)


def parse_rerank(request: RerankRequest, state: AppState) -> Plan[Reranking]:
    check_model(request.model, state.model_names)
    require_task(state.card, TASK_SCORE, "rerank")
    if not request.query:
        raise bad_request("`query` is an empty string.", param="query")
    documents = documents_of(request, state.config.max_inputs_per_request)
    is_tei = request.texts is not None
    refuse_the_other_forms_options(request, is_tei)
    param = "texts" if is_tei else "documents"
    pairs = [(request.query, document) for document in documents]
    params = [f"{param}[{i}]" for i in range(len(documents))]
    activation = value_of(use_activation=request.use_activation, activation=request.activation)
    if is_tei:  # TEI's options
        truncate, chunking = long_input_mode(request.long_input, -1 if request.truncate else None, state.config,
                                             cut="truncate")  # fmt: skip
        truncation = tei_truncation(truncate is not None, request.truncation_direction, state.card)
        if request.raw_scores and activation:
            raise bad_request(
                "`raw_scores` (TEI's) and `use_activation` or `activation` (vLLM's) say opposite things; send one.",
                param="raw_scores",
            )
        activation = not request.raw_scores if activation is None else activation
    else:
        truncate, chunking = long_input_mode(request.long_input, request.truncate_prompt_tokens, state.config)
        truncation = vllm_truncation(truncate, state.card, request.truncation_side)
    if request.max_tokens_per_doc is not None and chunking is not None:
        if chunking.option == "long_input":
            raise bad_request(
                "`max_tokens_per_doc` cuts each document, `long_input: chunk` reads all of it: send one.",
                param="max_tokens_per_doc",
            )
        chunking = None  # the request's own cut, rather than the server's default
    scoring = plan_scores(
        pairs,
        params,
        state.card,
        state.tokenizer,
        truncation=truncation,
        activation=activation is not False,
        budget=state.token_budget,
        second_tokens=request.max_tokens_per_doc,
        roles=("query", "document"),  # a bi-encoder embeds them as encode_query and encode_document do
        instruction=request.instruction,
        output=request.output,
        chunking=chunking,
    )
    return Plan(Reranking(request, documents, scoring), job=scoring.job)


def render_rerank(plan: Plan[Reranking], rows: Rows, state: AppState) -> bytes:
    request, documents = plan.context.request, plan.context.documents
    scores = plan.context.scoring.scores(rows if plan.sparse is None else plan.sparse)
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


def rerank_style(request: RerankRequest) -> ErrorStyle | None:
    """A TEI body (`texts`, not `documents` too) gets TEI's errors."""
    return TEI if request.texts is not None and request.documents is None else None


RERANK = Operation(RerankRequest, parse_rerank, render_rerank, rerank_style, takes_sparse=True)
