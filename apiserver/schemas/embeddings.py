"""POST /v1/embeddings (OpenAI's shape, plus vLLM's messages, normalize and truncate_prompt_tokens)."""

from __future__ import annotations

from typing import Literal

import msgspec

from apiserver.schemas.common import ItemsRequest, Usage


class EmbeddingRequest(ItemsRequest, kw_only=True):
    """OpenAI's fields, and vLLM's `messages`, `normalize` and `truncate_prompt_tokens` (in ItemsRequest)."""


class EmbeddingData(msgspec.Struct, kw_only=True):
    object: Literal["embedding"] = "embedding"
    index: int
    embedding: list[float] | str


class EmbeddingResponse(msgspec.Struct, kw_only=True):
    object: Literal["list"] = "list"
    data: list[EmbeddingData]
    model: str
    usage: Usage
