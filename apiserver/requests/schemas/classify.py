"""POST /classify (vLLM's shape)."""

from __future__ import annotations

from typing import Literal

import msgspec

from apiserver.requests.schemas.common import PeerRequest, Priority, TruncatePromptTokens, TruncationSide, Usage


class ClassifyRequest(PeerRequest, kw_only=True):
    input: str | list[str | int | list[int]]
    model: str | None = None
    truncate_prompt_tokens: TruncatePromptTokens | None = None
    truncation_side: TruncationSide | None = None
    priority: Priority = 0
    # Apply the model's activation (None: do); without it, probs are the raw logits. `activation` is
    # vLLM's older name for `use_activation`.
    use_activation: bool | None = None
    activation: bool | None = None
    add_special_tokens: bool = True
    user: str | None = None


class ClassifyData(msgspec.Struct, kw_only=True):
    index: int
    label: str
    probs: list[float]
    num_classes: int


class ClassifyResponse(msgspec.Struct, kw_only=True):
    id: str
    object: Literal["list"] = "list"
    created: int
    model: str
    data: list[ClassifyData]
    usage: Usage
