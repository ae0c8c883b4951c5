"""Every HTTP endpoint in one table: the routes are built from it, and so is /openapi.json."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from apiserver.routes.classify import create_classification
from apiserver.routes.embeddings import create_embeddings
from apiserver.routes.meta import get_version, list_models, live, ready
from apiserver.routes.pooling import create_pooling
from apiserver.routes.scoring import create_rerank, create_score
from apiserver.routes.tei import create_embed, create_prediction, get_info
from apiserver.routes.tokenize import create_text, create_tokens
from apiserver.schemas.classify import ClassifyRequest, ClassifyResponse
from apiserver.schemas.embeddings import EmbeddingRequest, EmbeddingResponse
from apiserver.schemas.meta import HealthResponse, ModelList, VersionResponse
from apiserver.schemas.pooling import PoolingRequest, PoolingResponse
from apiserver.schemas.scoring import (
    RerankRequest,
    RerankResponse,
    ScoreRequest,
    ScoreResponse,
    TeiRerankResponse,
)
from apiserver.schemas.tei import EmbedRequest, EmbedResponse, InfoResponse, PredictRequest, PredictResponse
from apiserver.schemas.tokenize import (
    DetokenizeRequest,
    DetokenizeResponse,
    TeiTokenizeResponse,
    TokenizeRequest,
    TokenizeResponse,
)

Handler = Callable[[Request], Awaitable[Response]]


@dataclass(frozen=True, slots=True)
class Endpoint:
    path: str
    method: str
    handler: Handler
    summary: str
    tag: str
    request: Any = None  # the msgspec type that decodes the JSON body
    response: Any = None  # the msgspec type of a 200 answer


RERANK = "Rank documents against a query. A body with `texts` (TEI) gets TEI's list of {index, score} back."

ENDPOINTS = [
    Endpoint(
        "/v1/embeddings", "POST", create_embeddings, "Embed texts, token ids or images.", "OpenAI",
        EmbeddingRequest, EmbeddingResponse,
    ),
    Endpoint("/v1/models", "GET", list_models, "The model names this server answers to.", "OpenAI", None, ModelList),
    Endpoint(
        "/pooling", "POST", create_pooling, "The model's pooled output (embeddings, or classifier scores).", "vLLM",
        PoolingRequest, PoolingResponse,
    ),
    Endpoint(
        "/score", "POST", create_score, "Score text pairs: 1:1, 1:N or N:N.", "vLLM", ScoreRequest, ScoreResponse
    ),
    Endpoint("/rerank", "POST", create_rerank, RERANK, "rerank", RerankRequest, RerankResponse | TeiRerankResponse),
    Endpoint("/v1/rerank", "POST", create_rerank, RERANK, "rerank", RerankRequest, RerankResponse | TeiRerankResponse),
    Endpoint("/v2/rerank", "POST", create_rerank, RERANK, "rerank", RerankRequest, RerankResponse | TeiRerankResponse),
    Endpoint(
        "/classify", "POST", create_classification, "A label and the probability of every label, per input.",
        "vLLM", ClassifyRequest, ClassifyResponse,
    ),
    Endpoint(
        "/tokenize", "POST", create_tokens, "Token ids of a prompt (vLLM), or TEI's token list for `inputs`.",
        "tokenizer", TokenizeRequest, TokenizeResponse | TeiTokenizeResponse,
    ),
    Endpoint(
        "/detokenize", "POST", create_text, "The text of token ids.", "tokenizer", DetokenizeRequest,
        DetokenizeResponse,
    ),
    Endpoint("/embed", "POST", create_embed, "Embed texts (TEI).", "TEI", EmbedRequest, EmbedResponse),
    Endpoint(
        "/predict", "POST", create_prediction, "Classify texts or text pairs (TEI).", "TEI", PredictRequest,
        PredictResponse,
    ),
    Endpoint("/info", "GET", get_info, "The model and the server's limits (TEI).", "TEI", None, InfoResponse),
    Endpoint("/version", "GET", get_version, "poolserve's version.", "server", None, VersionResponse),
    Endpoint("/health", "GET", ready, "200 when the engine answers and is not hung, else 503.", "server", None,
             HealthResponse),
    Endpoint("/health/ready", "GET", ready, "The same as /health.", "server", None, HealthResponse),
    Endpoint("/health/live", "GET", live, "200 while this process's event loop runs.", "server", None, HealthResponse),
    Endpoint("/ping", "GET", ready, "The same as /health.", "server", None, HealthResponse),
]  # fmt: skip
