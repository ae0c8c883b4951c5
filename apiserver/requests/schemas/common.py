"""Types several endpoints share: input items, chat-style messages, usage, errors."""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec
from msgspec import Meta

from poolserve.model_card import LongInput
from poolserve.protocol import PRIORITY_MAX, PRIORITY_MIN


class ImageInput(msgspec.Struct, forbid_unknown_fields=True):
    """An image as one input item: a data: URL, an http(s) URL, or an allowed local file."""

    image: str


# An OpenAI-style `input`: a string, a list of token ids, or a list whose items are strings,
# token-id lists or image items. msgspec allows one array type in a union, so the items' kinds
# are checked for sameness after decoding.
InputItem = str | int | list[int] | ImageInput
Input = str | list[InputItem]


class TextPart(msgspec.Struct, tag="text", tag_field="type"):
    text: str


class ImageUrl(msgspec.Struct):
    url: str
    detail: str | None = None


class ImageUrlPart(msgspec.Struct, tag="image_url", tag_field="type"):
    image_url: ImageUrl


ContentPart = TextPart | ImageUrlPart


class ChatMessage(msgspec.Struct):
    """vLLM's chat-style input: the messages together make one input."""

    role: str
    content: str | list[ContentPart]


EncodingFormat = Literal["float", "base64"]
# vLLM's base64 options: the dtype of each value (apiserver/requests/vector_bytes.py) and the byte order
# ("native": this server's).
EmbedDType = Literal["float32", "float16", "bfloat16", "fp8_e4m3", "fp8_e5m2"]
Endianness = Literal["native", "little", "big"]
Dimensions = Annotated[int, Meta(ge=1)]
# -1: cut to the model's maximum length; k >= 1: keep at most k tokens.
TruncatePromptTokens = Annotated[int, Meta(ge=-1)]
TruncationDirection = Literal["Left", "Right", "left", "right"]
# vLLM's `truncation_side`: which end `truncate_prompt_tokens` cuts ("right" keeps the first tokens).
TruncationSide = Literal["left", "right"]
# Which of a model's outputs scores pairs on /score and /rerank (poolserve's; bge-m3 has three: docs/api.md).
ScoreOutput = Literal["vector", "sparse", "multi_vector"]
# vLLM's `priority`: lower is served sooner; the engine ranks by it (engine_core/scheduler.py).
Priority = Annotated[int, Meta(ge=PRIORITY_MIN, le=PRIORITY_MAX)]
# poolserve's pruning of a sparse model's vectors (docs/api.md, "Sparse models"): keep the k largest values, and
# only values above the threshold.
SparseTopK = Annotated[int, Meta(ge=1)]
SparseThreshold = Annotated[float, Meta(ge=0)]


class Usage(msgspec.Struct, kw_only=True):
    prompt_tokens: int
    total_tokens: int


class PeerRequest(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """A request in a peer's shape (OpenAI, vLLM, Cohere, Jina, Voyage): a field this server does not
    know is refused with a 400 naming it, as OpenAI answers, never skipped (docs/api.md)."""


class ItemsRequest(PeerRequest, kw_only=True):
    """What /v1/embeddings and /pooling requests share: inputs as `input` or `messages`, and how the
    vectors come back."""

    input: Input | None = None
    messages: list[ChatMessage] | None = None
    model: str | None = None
    encoding_format: EncodingFormat = "float"
    dimensions: Dimensions | None = None
    truncate_prompt_tokens: TruncatePromptTokens | None = None
    priority: Priority = 0
    # L2-normalize the vectors (default: as the model's Sentence-Transformers files say). vLLM's
    # newer name for it is `use_activation`.
    normalize: bool | None = None
    use_activation: bool | None = None
    embed_dtype: EmbedDType = "float32"
    endianness: Endianness = "native"
    add_special_tokens: bool = True
    truncation_side: TruncationSide | None = None
    # OpenAI's end-user id: logged with the request id (apiserver/requests/request_cycle.py), not otherwise used.
    user: str | None = None
    # What an input past the model's maximum gets (None: --long-input): docs/api.md, "Long inputs".
    long_input: LongInput | None = None
