"""POST /pooling (vLLM's shape): the model's pooled output for any model kind."""

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


class PoolingRequest(msgspec.Struct, kw_only=True):
    input: Input | None = None
    messages: list[ChatMessage] | None = None
    model: str | None = None
    encoding_format: EncodingFormat = "float"
    dimensions: Dimensions | None = None
    truncate_prompt_tokens: TruncatePromptTokens | None = None
    # Embedding models: L2-normalize (default: as the model's authors set it).
    normalize: bool | None = None
    # Classifiers: apply the model's activation (sigmoid/softmax) to the logits.
    activation: bool = True
    user: str | None = None


class PoolingData(msgspec.Struct, kw_only=True):
    object: Literal["pooling"] = "pooling"
    index: int
    data: list[float] | str


class PoolingResponse(msgspec.Struct, kw_only=True):
    id: str
    object: Literal["list"] = "list"
    created: int
    model: str
    data: list[PoolingData]
    usage: Usage
