"""Every HTTP endpoint in one table: the routes are built from it, and so is /openapi.json."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from apiserver.operation import AnyOperation
from apiserver.request_cycle import Handler, handler_of
from apiserver.routes.classify import CLASSIFY
from apiserver.routes.embeddings import EMBEDDINGS
from apiserver.routes.meta import get_version, list_models, live, ready
from apiserver.routes.pooling import POOLING
from apiserver.routes.scoring import RERANK, SCORE
from apiserver.routes.tei import EMBED, PREDICT, get_info
from apiserver.routes.tokenize import DETOKENIZE, TOKENIZE
from apiserver.schemas.classify import ClassifyResponse
from apiserver.schemas.embeddings import EmbeddingResponse
from apiserver.schemas.meta import HealthResponse, ModelList, VersionResponse
from apiserver.schemas.pooling import PoolingResponse
from apiserver.schemas.scoring import RerankResponse, ScoreResponse, TeiRerankResponse
from apiserver.schemas.tei import EmbedResponse, InfoResponse, PredictResponse
from apiserver.schemas.tokenize import DetokenizeResponse, TeiTokenizeResponse, TokenizeResponse


@dataclass(frozen=True, slots=True)
class Endpoint:
    """A POST endpoint names its operation (run by the request cycle); a GET endpoint its handler."""

    path: str
    method: str
    summary: str
    tag: str
    response: Any = None  # the msgspec type of a 200 answer
    operation: AnyOperation | None = None
    handler: Handler | None = None

    @property
    def request(self) -> Any:
        """The msgspec type that decodes the JSON body, if any."""
        return None if self.operation is None else self.operation.request

    def route_handler(self) -> Handler:
        if self.operation is not None:
            return handler_of(self.operation)
        assert self.handler is not None, f"{self.path} has neither an operation nor a handler"
        return self.handler


def post(path: str, operation: AnyOperation, summary: str, tag: str, response: Any) -> Endpoint:
    return Endpoint(path, "POST", summary, tag, response, operation=operation)


def get(path: str, handler: Handler, summary: str, tag: str, response: Any) -> Endpoint:
    return Endpoint(path, "GET", summary, tag, response, handler=handler)


RERANK_SUMMARY = "Rank documents against a query. A body with `texts` (TEI) gets TEI's list of {index, score} back."
RERANK_RESPONSE = RerankResponse | TeiRerankResponse

ENDPOINTS = [
    post("/v1/embeddings", EMBEDDINGS, "Embed texts, token ids or images.", "OpenAI", EmbeddingResponse),
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
    post("/embed", EMBED, "Embed texts (TEI).", "TEI", EmbedResponse),
    post("/predict", PREDICT, "Classify texts or text pairs (TEI).", "TEI", PredictResponse),
    get("/info", get_info, "The model and the server's limits (TEI).", "TEI", InfoResponse),
    get("/version", get_version, "poolserve's version.", "server", VersionResponse),
    get("/health", ready, "200 when the engine answers and is not hung, else 503.", "server", HealthResponse),
    get("/health/ready", ready, "The same as /health.", "server", HealthResponse),
    get("/health/live", live, "200 while this process's event loop runs.", "server", HealthResponse),
    get("/ping", ready, "The same as /health.", "server", HealthResponse),
]  # fmt: skip
