"""POST /score (vLLM), /rerank, /v1/rerank, /v2/rerank (Jina/Cohere/vLLM, and TEI's `texts` form)."""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec
from msgspec import Meta

from apiserver.requests.schemas.common import (
    PeerRequest,
    Priority,
    ScoreOutput,
    TruncatePromptTokens,
    TruncationDirection,
    TruncationSide,
    Usage,
)
from poolserve.model_card import LongInput

ScoreTexts = str | list[str]


class ScoreRequest(PeerRequest, kw_only=True):
    """vLLM's four spellings of the two sides, one of them per request: `queries` with `documents` or
    `items` (its newer names), `data_1`/`data_2`, or `text_1`/`text_2` (its older ones)."""

    queries: ScoreTexts | None = None
    documents: ScoreTexts | None = None
    items: ScoreTexts | None = None
    data_1: ScoreTexts | None = None
    data_2: ScoreTexts | None = None
    text_1: ScoreTexts | None = None
    text_2: ScoreTexts | None = None
    model: str | None = None
    truncate_prompt_tokens: TruncatePromptTokens | None = None
    truncation_side: TruncationSide | None = None
    priority: Priority = 0
    # Cross-encoders: apply the model's activation to the logit (None: do; scores in 0..1 for one
    # label). `activation` is vLLM's older name for `use_activation`.
    use_activation: bool | None = None
    activation: bool | None = None
    user: str | None = None
    # poolserve's: the instruction an LLM reranker's template puts before the pair (Qwen3-Reranker's `instruction`).
    instruction: str | None = None
    # poolserve's: which of the model's outputs scores the pairs (None: its own; bge-m3's dense vector).
    output: ScoreOutput | None = None
    # poolserve's: what a document past the model's maximum gets (None: --long-input); chunked, its best window's score.
    long_input: LongInput | None = None


class ScoreData(msgspec.Struct, kw_only=True):
    index: int
    object: Literal["score"] = "score"
    score: float


class ScoreResponse(msgspec.Struct, kw_only=True):
    id: str
    object: Literal["list"] = "list"
    created: int
    model: str
    data: list[ScoreData]
    usage: Usage


class RerankDocument(msgspec.Struct):
    text: str


class RerankRequest(PeerRequest, kw_only=True):
    """Jina/Cohere/vLLM rerank; TEI's form sends `texts` instead of `documents` and gets TEI's answer."""

    query: str
    documents: list[str | RerankDocument] | None = None
    texts: list[str] | None = None
    model: str | None = None
    top_n: Annotated[int, Meta(ge=0)] | None = None
    return_documents: bool = True
    truncate_prompt_tokens: TruncatePromptTokens | None = None
    truncation_side: TruncationSide | None = None
    priority: Priority = 0
    # vLLM's: apply the model's activation (None: do; TEI's form says it with `raw_scores`).
    use_activation: bool | None = None
    activation: bool | None = None
    # Cohere's: cut each document to its first this many tokens before scoring.
    max_tokens_per_doc: Annotated[int, Meta(ge=1)] | None = None
    # TEI's options.
    raw_scores: bool = False
    return_text: bool = False
    truncate: bool = False
    truncation_direction: TruncationDirection = "Right"
    user: str | None = None
    # poolserve's: the instruction an LLM reranker's template puts before the pair (Qwen3-Reranker's `instruction`).
    instruction: str | None = None
    # poolserve's: which of the model's outputs scores the documents (None: its own; bge-m3's dense vector).
    output: ScoreOutput | None = None
    # poolserve's: what a document past the model's maximum gets (None: --long-input); chunked, its best window's score.
    long_input: LongInput | None = None


class RerankResult(msgspec.Struct, kw_only=True):
    index: int
    relevance_score: float
    document: RerankDocument | None = None


class RerankUsage(msgspec.Struct, kw_only=True):
    prompt_tokens: int
    total_tokens: int


class RerankResponse(msgspec.Struct, kw_only=True):
    id: str
    model: str
    usage: RerankUsage
    results: list[RerankResult]


class TeiRank(msgspec.Struct, kw_only=True, omit_defaults=True):
    index: int
    score: float
    text: str | None = None


TeiRerankResponse = list[TeiRank]
