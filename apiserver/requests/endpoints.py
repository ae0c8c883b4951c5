"""Every HTTP endpoint in one table: the routes are built from it, and so is /openapi.json."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from apiserver.connection.gate import Handler
from apiserver.errors import OPENAI, TEI, ErrorStyle
from apiserver.requests.operation import AnyOperation
from apiserver.requests.request_cycle import handler_of
from apiserver.requests.routes.classify import CLASSIFY
from apiserver.requests.routes.embeddings import EMBEDDINGS
from apiserver.requests.routes.meta import get_version, list_models, live, ready
from apiserver.requests.routes.pooling import POOLING
from apiserver.requests.routes.root import EMBED_OR_SIMILARITY
from apiserver.requests.routes.scoring import RERANK, SCORE
from apiserver.requests.routes.similarity import SIMILARITY
from apiserver.requests.routes.tei import EMBED, EMBED_ALL, EMBED_SPARSE, PREDICT, get_info
from apiserver.requests.routes.tokenize import DECODE, DETOKENIZE, TOKENIZE
from apiserver.requests.schemas.classify import ClassifyResponse
from apiserver.requests.schemas.embeddings import EmbeddingResponse
from apiserver.requests.schemas.meta import HealthResponse, ModelList, VersionResponse
from apiserver.requests.schemas.pooling import PoolingResponse
from apiserver.requests.schemas.scoring import RerankResponse, ScoreResponse, TeiRerankResponse
from apiserver.requests.schemas.tei import (
    EmbedAllResponse,
    EmbedOrSimilarityResponse,
    EmbedResponse,
    EmbedSparseResponse,
    InfoResponse,
    PredictResponse,
    SimilarityResponse,
)
from apiserver.requests.schemas.tokenize import (
    DecodeResponse,
    DetokenizeResponse,
    TeiTokenizeResponse,
    TokenizeResponse,
)
from poolserve.model_card import CLASSIFIER, SPARSE, TASK_SCORE, ModelCard


@dataclass(frozen=True, slots=True)
class Endpoint:
    """A POST endpoint names its operation (run by the request cycle); a GET endpoint its handler.
    `error_style`: the shape of its errors, OpenAI's or TEI's (apiserver/errors.py)."""

    path: str
    method: str
    summary: str
    tag: str
    response: Any = None  # the msgspec type of a 200 answer
    operation: AnyOperation | None = None
    handler: Handler | None = None
    error_style: ErrorStyle = OPENAI

    @property
    def request(self) -> Any:
        """The msgspec type that decodes the JSON body, if any."""
        return None if self.operation is None else self.operation.request

    def route_handler(self) -> Handler:
        if self.operation is not None:
            return handler_of(self.operation)
        assert self.handler is not None, f"{self.path} has neither an operation nor a handler"
        return self.handler


def post(
    path: str, operation: AnyOperation, summary: str, tag: str, response: Any, *, errors: ErrorStyle = OPENAI
) -> Endpoint:
    return Endpoint(path, "POST", summary, tag, response, operation=operation, error_style=errors)


def get(path: str, handler: Handler, summary: str, tag: str, response: Any, *, errors: ErrorStyle = OPENAI) -> Endpoint:
    return Endpoint(path, "GET", summary, tag, response, handler=handler, error_style=errors)


RERANK_SUMMARY = "Rank documents against a query. A body with `texts` (TEI) gets TEI's list of {index, score} back."
RERANK_RESPONSE = RerankResponse | TeiRerankResponse

ENDPOINTS = [
    post("/v1/embeddings", EMBEDDINGS, "Embed texts, token ids or images.", "OpenAI", EmbeddingResponse),
    post("/embeddings", EMBEDDINGS, "The same as /v1/embeddings (TEI serves both).", "OpenAI", EmbeddingResponse),
    get("/v1/models", list_models, "The model names this server answers to.", "OpenAI", ModelList),
    post(
        "/pooling", POOLING, "The model's pooled output (embeddings, or classifier scores).", "vLLM", PoolingResponse
    ),
    post("/score", SCORE, "Score text pairs: 1:1, 1:N or N:N.", "vLLM", ScoreResponse),
    post("/v1/score", SCORE, "The same as /score (vLLM serves both).", "vLLM", ScoreResponse),
    post("/rerank", RERANK, RERANK_SUMMARY, "rerank", RERANK_RESPONSE),
    post("/v1/rerank", RERANK, RERANK_SUMMARY, "rerank", RERANK_RESPONSE),
    post("/v2/rerank", RERANK, RERANK_SUMMARY, "rerank", RERANK_RESPONSE),
    post("/classify", CLASSIFY, "A label and the probability of every label, per input.", "vLLM", ClassifyResponse),
    post(
        "/tokenize", TOKENIZE, "Token ids of a prompt (vLLM), or TEI's token list for `inputs`.", "tokenizer",
        TokenizeResponse | TeiTokenizeResponse,
    ),
    post("/detokenize", DETOKENIZE, "The text of token ids.", "tokenizer", DetokenizeResponse),
    post("/embed", EMBED, "Embed texts (TEI).", "TEI", EmbedResponse, errors=TEI),
    post("/embed_all", EMBED_ALL, "Every token's hidden state, unpooled (TEI).", "TEI", EmbedAllResponse, errors=TEI),
    post(
        "/embed_sparse", EMBED_SPARSE, "A SPLADE model's sparse vectors (TEI); 424 from any other model, as TEI's.",
        "TEI", EmbedSparseResponse, errors=TEI,
    ),
    post(
        "/similarity", SIMILARITY, "Cosine similarity of sentences to a source sentence (TEI).", "TEI",
        SimilarityResponse, errors=TEI,
    ),
    post("/predict", PREDICT, "Classify texts or text pairs (TEI).", "TEI", PredictResponse, errors=TEI),
    post("/decode", DECODE, "The texts of token ids (TEI).", "TEI", DecodeResponse, errors=TEI),
    get("/info", get_info, "The model and the server's limits (TEI).", "TEI", InfoResponse, errors=TEI),
    get("/version", get_version, "poolserve's version.", "server", VersionResponse),
    get("/health", ready, "200 when the engine answers, not hung; else 503.", "server", HealthResponse, errors=TEI),
    get("/health/ready", ready, "The same as /health.", "server", HealthResponse),
    get("/health/live", live, "200 while this process's event loop runs.", "server", HealthResponse),
    get("/ping", ready, "The same as /health (SageMaker's probe).", "server", HealthResponse, errors=TEI),
    get("/", ready, "The same as /health (TEI).", "server", HealthResponse, errors=TEI),
]  # fmt: skip


# What the app serves beside ENDPOINTS: the model's TEI routes (model_endpoints) and apiserver/app.py's own.
OTHER_PATHS = frozenset({"/", "/invocations", "/openapi.json", "/metrics"})


def model_endpoints(card: ModelCard) -> list[Endpoint]:
    """POST / and /invocations (SageMaker's route), answered by the route TEI picks for the model's kind: a
    reranker (a one-label classifier) ranks as /rerank, another classifier predicts as /predict, a SPLADE model
    answers as /embed_sparse (poolserve serves it no dense /embed), any other model embeds as /embed, or, given
    /similarity's body, compares as /similarity (routes/root.py). Bodies and errors are that route's, in TEI's
    style."""
    chosen: tuple[str, AnyOperation, Any]
    if card.kind == SPARSE:
        chosen = ("/embed_sparse", EMBED_SPARSE, EmbedSparseResponse)
    elif card.kind == CLASSIFIER:
        if card.supports(TASK_SCORE):
            chosen = ("/rerank", RERANK, RERANK_RESPONSE)
        else:
            chosen = ("/predict", PREDICT, PredictResponse)
    else:
        chosen = ("/embed", EMBED_OR_SIMILARITY, EmbedOrSimilarityResponse)
    name, operation, response = chosen
    return [
        post(path, operation, f"The same as {name} for this model (TEI, {what}).", "TEI", response, errors=TEI)
        for path, what in (("/", "by the model's kind"), ("/invocations", "SageMaker's route"))
    ]
