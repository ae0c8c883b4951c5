"""POST /tokenize (vLLM's `prompt`, or TEI's `inputs`) and POST /detokenize: answered without the model."""

from __future__ import annotations

from typing import TypeVar

from apiserver.errors import bad_request
from apiserver.inputs.text import check_token_rows
from apiserver.limits import check_input_count
from apiserver.operation import Operation, Plan, Rows
from apiserver.responses import encode_json
from apiserver.schemas.tokenize import (
    DetokenizeRequest,
    DetokenizeResponse,
    TeiToken,
    TokenizeRequest,
    TokenizeResponse,
)
from apiserver.state import AppState
from apiserver.validation import check_model

TokenizeAnswer = TokenizeResponse | list[list[TeiToken]]
Answer = TypeVar("Answer")


def parse_tokenize(request: TokenizeRequest, state: AppState) -> Plan[TokenizeAnswer]:
    check_model(request.model, state.model_names)
    if (request.prompt is None) == (request.inputs is None):
        raise bad_request("Send exactly one of `prompt` (vLLM) and `inputs` (TEI).", param="prompt")
    special = request.add_special_tokens
    if request.prompt is not None:
        ids = state.tokenizer.encode([request.prompt], add_special_tokens=special)[0]
        return Plan(
            TokenizeResponse(
                count=len(ids),
                max_model_len=state.card.max_model_len,
                tokens=ids,
                token_strs=state.tokenizer.token_strings(ids) if request.return_token_strs else None,
            )
        )
    texts = [request.inputs] if isinstance(request.inputs, str) else request.inputs or []
    check_input_count(len(texts), state.config.max_inputs_per_request, "inputs")
    return Plan([tei_tokens(text, state, special) for text in texts])


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


def parse_detokenize(request: DetokenizeRequest, state: AppState) -> Plan[DetokenizeResponse]:
    check_model(request.model, state.model_names)
    if request.tokens:
        check_token_rows([request.tokens], ["tokens"], limit=len(request.tokens), card=state.card)
    return Plan(DetokenizeResponse(prompt=state.tokenizer.decode(request.tokens)))


def render_answer(plan: Plan[Answer], rows: Rows, state: AppState) -> bytes:
    """The answer parse made (no model ran)."""
    return encode_json(plan.context)


TOKENIZE: Operation[TokenizeRequest, TokenizeAnswer] = Operation(TokenizeRequest, parse_tokenize, render_answer)
DETOKENIZE: Operation[DetokenizeRequest, DetokenizeResponse] = Operation(
    DetokenizeRequest, parse_detokenize, render_answer
)
