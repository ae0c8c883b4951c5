"""POST /tokenize (vLLM's `prompt`, or TEI's `inputs`) and POST /detokenize."""

from __future__ import annotations

import msgspec
from starlette.requests import Request
from starlette.responses import Response

from apiserver.errors import bad_request
from apiserver.inputs.text import check_token_rows
from apiserver.pipeline import preprocess_body
from apiserver.responses import json_response
from apiserver.schemas.tokenize import (
    DetokenizeRequest,
    DetokenizeResponse,
    TeiToken,
    TokenizeRequest,
    TokenizeResponse,
)
from apiserver.state import AppState
from apiserver.validation import check_model, decode_body

_tokenize_decoder = msgspec.json.Decoder(TokenizeRequest)
_detokenize_decoder = msgspec.json.Decoder(DetokenizeRequest)


def tokenize(body: bytes, state: AppState) -> TokenizeResponse | list[list[TeiToken]]:
    request = decode_body(body, _tokenize_decoder)
    check_model(request.model, state.model_names)
    if (request.prompt is None) == (request.inputs is None):
        raise bad_request("Send exactly one of `prompt` (vLLM) and `inputs` (TEI).", param="prompt")
    special = request.add_special_tokens
    if request.prompt is not None:
        ids = state.tokenizer.encode([request.prompt], add_special_tokens=special)[0]
        return TokenizeResponse(
            count=len(ids),
            max_model_len=state.card.max_model_len,
            tokens=ids,
            token_strs=state.tokenizer.token_strings(ids) if request.return_token_strs else None,
        )
    texts = [request.inputs] if isinstance(request.inputs, str) else request.inputs or []
    if len(texts) > state.config.max_inputs_per_request:
        raise bad_request(f"`inputs` has {len(texts)} texts; at most {state.config.max_inputs_per_request}.")
    return [tei_tokens(text, state, special) for text in texts]


def tei_tokens(text: str, state: AppState, add_special_tokens: bool) -> list[TeiToken]:
    encoding = state.tokenizer.encode_detailed(text, add_special_tokens=add_special_tokens)
    tokens = []
    for token_id, token, is_special, (start, stop) in zip(
        encoding.ids, encoding.tokens, encoding.special_tokens_mask, encoding.offsets, strict=True
    ):
        if is_special:
            tokens.append(TeiToken(id=token_id, text=token, special=True, start=None, stop=None))
        else:
            tokens.append(TeiToken(id=token_id, text=text[start:stop], special=False, start=start, stop=stop))
    return tokens


async def create_tokens(request: Request) -> Response:
    return json_response(await preprocess_body(request, tokenize))


def detokenize(body: bytes, state: AppState) -> DetokenizeResponse:
    request = decode_body(body, _detokenize_decoder)
    check_model(request.model, state.model_names)
    if request.tokens:
        check_token_rows([request.tokens], ["tokens"], limit=len(request.tokens), card=state.card)
    return DetokenizeResponse(prompt=state.tokenizer.decode(request.tokens))


async def create_text(request: Request) -> Response:
    return json_response(await preprocess_body(request, detokenize))
