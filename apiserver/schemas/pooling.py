"""POST /pooling (vLLM's shape): the model's pooled output for any model kind."""

from __future__ import annotations

from typing import Literal

import msgspec

from apiserver.schemas.common import ItemsRequest, Usage


class PoolingRequest(ItemsRequest, kw_only=True):
    # Classifiers: apply the model's activation (sigmoid/softmax) to the logits (None: do). vLLM's
    # older name for `use_activation`.
    activation: bool | None = None


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
