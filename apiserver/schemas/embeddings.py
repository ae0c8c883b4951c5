"""POST /v1/embeddings (OpenAI's shape, plus vLLM's messages, normalize and truncate_prompt_tokens)."""

from __future__ import annotations

from typing import Literal

import msgspec

from apiserver.schemas.common import (
    ChatMessage,
    Dimensions,
    EncodingFormat,
    Input,
    TruncatePromptTokens,
    Usage,
)


class EmbeddingRequest(msgspec.Struct, kw_only=True):
    input: Input | None = None
    messages: list[ChatMessage] | None = None
    model: str | None = None
    encoding_format: EncodingFormat = "float"
    dimensions: Dimensions | None = None
    user: str | None = None
    truncate_prompt_tokens: TruncatePromptTokens | None = None
    normalize: bool | None = None


class EmbeddingData(msgspec.Struct, kw_only=True):
    object: Literal["embedding"] = "embedding"
    index: int
    embedding: list[float] | str


class EmbeddingResponse(msgspec.Struct, kw_only=True):
    object: Literal["list"] = "list"
    data: list[EmbeddingData]
    model: str
    usage: Usage
