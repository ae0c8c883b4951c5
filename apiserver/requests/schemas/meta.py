"""GET /v1/models, /version, /health: what the server is and whether it answers."""

from __future__ import annotations

from typing import Literal

import msgspec


class ModelEntry(msgspec.Struct, kw_only=True):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "poolserve"
    root: str
    max_model_len: int
    # poolserve's: what the model is (embedding, classifier, clip, sparse) and what it answers (its card's tasks:
    # embed, embed_sparse, token_embed, score, classify, pool, tokenize).
    kind: str = ""
    tasks: list[str] = msgspec.field(default_factory=list)
    # What one input gives: "vector" (an embedding), "sparse" (a SPLADE model's non-zero entries), "multi_vector"
    # (a late-interaction model's token vectors), or "scores" (a classifier's, cross-encoder's or LLM reranker's).
    output: str = "vector"
    # Every output a request may ask for, the model's own first (bge-m3: vector, sparse, multi_vector).
    outputs: list[str] = msgspec.field(default_factory=list)


class ModelList(msgspec.Struct, kw_only=True):
    object: Literal["list"] = "list"
    data: list[ModelEntry]


class VersionResponse(msgspec.Struct):
    version: str


class EngineHealth(msgspec.Struct, kw_only=True):
    """What the engine's I/O thread said: inputs and tokens waiting or running, and how long the
    current forward pass has run (0 when idle)."""

    queued_inputs: int
    queued_tokens: int
    busy_seconds: float


class ModelHealth(msgspec.Struct, kw_only=True, omit_defaults=True):
    """One model's engines, on a server of several."""

    engine: EngineHealth
    silent_engines: list[int] = msgspec.field(default_factory=list)


class HealthResponse(msgspec.Struct, kw_only=True, omit_defaults=True):
    status: str
    engine: EngineHealth | None = None
    # With several engines: those not answering now (restarting, or out of service), while the others serve.
    silent_engines: list[int] = msgspec.field(default_factory=list)
    # With several models: each one's own `engine` and `silent_engines` (the fields above are the default model's).
    models: dict[str, ModelHealth] = msgspec.field(default_factory=dict)
