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


class ModelList(msgspec.Struct, kw_only=True):
    object: Literal["list"] = "list"
    data: list[ModelEntry]


class VersionResponse(msgspec.Struct):
    version: str


class HealthResponse(msgspec.Struct):
    status: str
