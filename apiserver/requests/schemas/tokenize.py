"""POST /tokenize and /detokenize: vLLM's shapes, and TEI's /tokenize (`inputs`)."""

from __future__ import annotations

import msgspec

from apiserver.requests.schemas.common import PeerRequest


class TokenizeRequest(PeerRequest, kw_only=True):
    """vLLM sends `prompt`; TEI sends `inputs` and gets TEI's answer. vLLM's chat form (`messages`,
    `chat_template`, ...) is unknown here, so refused by name: poolserve applies no chat template."""

    prompt: str | None = None
    inputs: str | list[str] | None = None
    model: str | None = None
    add_special_tokens: bool = True
    return_token_strs: bool = False
    # TEI's: the Sentence-Transformers prompt put before the text (apiserver/requests/prompts.py).
    prompt_name: str | None = None


class TokenizeResponse(msgspec.Struct, kw_only=True):
    count: int
    max_model_len: int
    tokens: list[int]
    token_strs: list[str] | None = None


class TeiToken(msgspec.Struct, kw_only=True):
    id: int
    text: str
    special: bool
    start: int | None
    stop: int | None


TeiTokenizeResponse = list[list[TeiToken]]


class DetokenizeRequest(PeerRequest, kw_only=True):
    tokens: list[int]
    model: str | None = None


class DetokenizeResponse(msgspec.Struct, kw_only=True):
    prompt: str


class DecodeRequest(msgspec.Struct, kw_only=True):
    """TEI's /decode: one list of ids, or a list of them."""

    ids: list[int | list[int]]
    skip_special_tokens: bool = True


DecodeResponse = list[str]
