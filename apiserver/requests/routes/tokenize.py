"""POST /tokenize (vLLM's `prompt`, or TEI's `inputs`), POST /detokenize (vLLM) and POST /decode (TEI):
answered without the model."""

from __future__ import annotations

from typing import TypeVar

from tokenizers import Encoding

from apiserver.errors import TEI, ErrorStyle, bad_request
from apiserver.requests.inputs.text import check_token_rows
from apiserver.requests.limits import TokenBudget, check_input_count
from apiserver.requests.operation import Operation, Plan, Rows
from apiserver.requests.prompts import named_prompt
from apiserver.requests.responses import encode_json
from apiserver.requests.schemas.tokenize import (
    DecodeRequest,
    DecodeResponse,
    DetokenizeRequest,
    DetokenizeResponse,
    TeiToken,
    TokenizeRequest,
    TokenizeResponse,
)
from apiserver.requests.state import AppState
from apiserver.requests.text_template import chat_texts
from apiserver.requests.validation import check_model

# Texts up to this long are tokenized at once, holding the GIL for well under a millisecond; longer ones
# through `encode_batch`, which releases it.
INLINE_CHARS = 8192

TokenizeAnswer = TokenizeResponse | list[list[TeiToken]]
Answer = TypeVar("Answer")


def parse_tokenize(request: TokenizeRequest, state: AppState) -> Plan[TokenizeAnswer]:
    check_model(request.model, state.model_names)
    if (request.prompt is None) == (request.inputs is None):
        raise bad_request("Send exactly one of `prompt` (vLLM) and `inputs` (TEI).", param="prompt")
    # TEI's form gets the prompt TEI's /embed would put before its texts (the default without `prompt_name`);
    # vLLM's, which knows no Sentence-Transformers prompts, only the one `prompt_name` names.
    prompt = (
        ""
        if request.prompt is not None and request.prompt_name is None
        else named_prompt(state.card, request.prompt_name)
    )
    special = request.add_special_tokens
    budget = TokenBudget(state.config.max_tokens_per_request)  # no engine queue to fit: its own flag only
    if request.prompt is not None:
        ids = tokenize_within(prompt + request.prompt, special, state, budget).ids
        budget.check(len(ids))
        return Plan(
            TokenizeResponse(
                count=len(ids),
                max_model_len=state.card.max_model_len,
                tokens=ids,
                token_strs=state.tokenizer.token_strings(ids) if request.return_token_strs else None,
            )
        )
    texts = [request.inputs] if isinstance(request.inputs, str) else request.inputs
    if not texts:
        raise bad_request("`inputs` must not be empty.", param="inputs", code="empty_input")
    check_input_count(len(texts), state.config.max_inputs_per_request, "inputs")
    answer: list[list[TeiToken]] = []
    total = 0
    if state.card.text_template is not None:  # what /embed reads: each text rendered by the model's chat template
        chat = chat_texts(state.card)
        texts, prompt, special = [chat.render(text, prompt, None) for text in texts], "", False
    for text in (prompt + text for text in texts):
        encoding = tokenize_within(text, special, state, budget, before=total)
        total += len(encoding)
        budget.check(total, so_far=len(answer) + 1 < len(texts))
        answer.append(tei_tokens(text, encoding))
    return Plan(answer)


def tokenize_within(
    text: str, add_special_tokens: bool, state: AppState, budget: TokenBudget, *, before: int = 0
) -> Encoding:
    """The text's encoding; a long text through a window (apiserver/requests/tokenizer.py), refused as soon as it
    holds more tokens than `budget` leaves after `before`, without tokenizing the rest."""
    tokenizer = state.tokenizer
    if len(text) <= INLINE_CHARS:
        return tokenizer.encode_detailed(text, add_special_tokens=add_special_tokens)
    content = tokenizer.encode_content(text, max(budget.limit - before, 0) + 1)
    if not content.is_whole:
        budget.check(before + len(content), so_far=True)
    return tokenizer.finish(content, add_special_tokens=add_special_tokens)


def tei_tokens(text: str, encoding: Encoding) -> list[TeiToken]:
    tokens = []
    for token_id, token, is_special, (start, stop) in zip(
        encoding.ids, encoding.tokens, encoding.special_tokens_mask, encoding.offsets, strict=True
    ):
        if is_special:
            tokens.append(TeiToken(id=token_id, text=token, special=True, start=None, stop=None))
        else:
            tokens.append(TeiToken(id=token_id, text=text[start:stop], special=False, start=start, stop=stop))
    return tokens


def decode_budget(state: AppState) -> TokenBudget:
    """The ids one request may decode: as many as one may tokenize (--max-tokens-per-request), which bounds the
    answer (a 4 MB body of ids decoded to a 19 MB answer, and held its API server for over a second)."""
    return TokenBudget(state.config.max_tokens_per_request)


def parse_detokenize(request: DetokenizeRequest, state: AppState) -> Plan[DetokenizeResponse]:
    check_model(request.model, state.model_names)
    decode_budget(state).check(len(request.tokens))
    if request.tokens:
        check_token_rows([request.tokens], ["tokens"], limit=len(request.tokens), card=state.card)
    return Plan(DetokenizeResponse(prompt=state.tokenizer.decode(request.tokens)))


def parse_decode(request: DecodeRequest, state: AppState) -> Plan[DecodeResponse]:
    """TEI's reading of `ids`: one list of ids (even an empty one), or a list of them."""
    ids = request.ids
    batch: list[list[int]]
    if all(isinstance(item, int) for item in ids):
        batch = [ids]  # type: ignore[list-item]
    elif all(isinstance(item, list) for item in ids):
        batch = ids  # type: ignore[assignment]
        if not batch:
            raise bad_request("`ids` must not be empty.", param="ids", code="empty_input")
    else:
        raise bad_request("`ids` must be a list of token ids, or a list of such lists.", param="ids")
    check_input_count(len(batch), state.config.max_inputs_per_request, "ids")
    decode_budget(state).check(sum(map(len, batch)))
    params = ["ids"] if batch is not ids else [f"ids[{i}]" for i in range(len(batch))]
    for row, param in zip(batch, params, strict=True):
        if row:
            check_token_rows([row], [param], limit=len(row), card=state.card)
    skip = request.skip_special_tokens
    return Plan([state.tokenizer.decode(row, skip_special_tokens=skip) for row in batch])


def tokenize_style(request: TokenizeRequest) -> ErrorStyle | None:
    """A TEI body (`inputs`, not `prompt` too) gets TEI's errors."""
    return TEI if request.inputs is not None and request.prompt is None else None


def render_answer(plan: Plan[Answer], rows: Rows, state: AppState) -> bytes:
    """The answer parse made (no model ran)."""
    return encode_json(plan.context)


TOKENIZE: Operation[TokenizeRequest, TokenizeAnswer] = Operation(
    TokenizeRequest, parse_tokenize, render_answer, tokenize_style
)
DETOKENIZE: Operation[DetokenizeRequest, DetokenizeResponse] = Operation(
    DetokenizeRequest, parse_detokenize, render_answer
)
DECODE: Operation[DecodeRequest, DecodeResponse] = Operation(DecodeRequest, parse_decode, render_answer)
