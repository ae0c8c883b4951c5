"""POST /v1/embeddings (OpenAI's shape, plus vLLM's options, and Voyage's, whose clients post here too)."""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec
from msgspec import Meta

from apiserver.requests.schemas.common import ItemsRequest, Usage

# Voyage's output types: "binary"/"ubinary" pack one bit per dimension (apiserver/requests/vector_bytes.py);
# "int8"/"uint8" are refused: Voyage's scaling for them is its models' own and undocumented.
OutputDType = Literal["float", "int8", "uint8", "binary", "ubinary"]
VoyageInputType = Literal["query", "document"]


class EmbeddingRequest(ItemsRequest, kw_only=True):
    """OpenAI's fields, vLLM's (in ItemsRequest), and Voyage's `input_type`, `truncation`,
    `output_dimension` and `output_dtype`."""

    input_type: VoyageInputType | None = None
    truncation: bool | None = None
    output_dimension: Annotated[int, Meta(ge=1)] | None = None
    output_dtype: OutputDType = "float"


class EmbeddingData(msgspec.Struct, kw_only=True):
    object: Literal["embedding"] = "embedding"
    index: int
    # Voyage's binary types answer integers (JSON numbers, as floats are).
    embedding: list[float] | str


class EmbeddingResponse(msgspec.Struct, kw_only=True):
    object: Literal["list"] = "list"
    data: list[EmbeddingData]
    model: str
    usage: Usage
