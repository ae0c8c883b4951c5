"""Request and response types of POST /v1/embeddings (OpenAI's shape, plus vLLM's truncate_prompt_tokens)."""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec
from msgspec import Meta


class EmbeddingRequest(msgspec.Struct, kw_only=True):
    # A string, a list of strings, a list of token ids, or a list of lists of token ids. msgspec
    # allows one array type in a union, so the element types are checked for sameness after decoding.
    input: str | list[str | int | list[int]]
    model: str | None = None
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: Annotated[int, Meta(ge=1)] | None = None
    user: str | None = None
    # -1: truncate to the model's maximum length; k >= 1: keep at most k tokens.
    truncate_prompt_tokens: Annotated[int, Meta(ge=-1)] | None = None


class EmbeddingData(msgspec.Struct, kw_only=True):
    object: Literal["embedding"] = "embedding"
    index: int
    embedding: list[float] | str


class Usage(msgspec.Struct, kw_only=True):
    prompt_tokens: int
    total_tokens: int


class EmbeddingResponse(msgspec.Struct, kw_only=True):
    object: Literal["list"] = "list"
    data: list[EmbeddingData]
    model: str
    usage: Usage
