"""Turns an embeddings request into token-id rows for the engine: validation, tokenization, truncation."""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import msgspec
import numpy as np

from apiserver.errors import ApiError, bad_request, from_validation_error
from apiserver.schemas.embeddings import EmbeddingRequest
from apiserver.tokenizer import TextTokenizer
from engine_core.protocol import TOKEN_DTYPE, ModelCard

_decoder = msgspec.json.Decoder(EmbeddingRequest)


@dataclass(frozen=True, slots=True)
class TokenizedInputs:
    lengths: list[int]
    tokens: bytes
    dimensions: int

    @property
    def prompt_tokens(self) -> int:
        return sum(self.lengths)


def decode_embedding_request(body: bytes) -> EmbeddingRequest:
    try:
        return _decoder.decode(body)
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        raise from_validation_error(exc) from None


def check_model(requested: str | None, served: list[str]) -> None:
    if requested is not None and requested not in served:
        raise ApiError(
            404,
            f"The model {requested!r} does not exist; this server serves {', '.join(map(repr, served))}.",
            param="model",
            code="model_not_found",
        )


# What each input kind is called in error messages: (what it must be, what an empty one is).
INPUT_KINDS: dict[type, tuple[str, str]] = {
    str: ("a string", "an empty string"),
    list: ("a list of token ids", "an empty list of token ids"),
}


def split_input(value: str | list[str | int | list[int]]) -> tuple[list[str], list[list[int]]]:
    """Texts, or token-id rows: one of the two is empty. Mixed or empty input is a 400."""
    if isinstance(value, str):
        value = [value]
    if not value:
        raise bad_request("`input` must not be empty.", param="input")
    if isinstance(value[0], int):
        if not all(isinstance(item, int) for item in value):
            raise bad_request("`input` mixes token ids with other kinds of input.", param="input")
        return [], [value]  # type: ignore[list-item]
    kind = type(value[0])
    noun, empty = INPUT_KINDS[kind]
    for i, item in enumerate(value):
        if not isinstance(item, kind):
            raise bad_request(f"`input[{i}]` must be {noun} like the other inputs.", param=f"input[{i}]")
        if not item:
            raise bad_request(f"`input[{i}]` is {empty}.", param=f"input[{i}]")
    if kind is str:
        return value, []  # type: ignore[return-value]
    return [], value  # type: ignore[return-value]


def resolve_token_limit(truncate_prompt_tokens: int | None, card: ModelCard) -> int | None:
    """How many tokens an input may keep when the request asks for truncation; None when it does not."""
    if truncate_prompt_tokens is None:
        return None
    if truncate_prompt_tokens == -1:
        return card.max_model_len
    if truncate_prompt_tokens == 0 or truncate_prompt_tokens > card.max_model_len:
        raise bad_request(
            f"`truncate_prompt_tokens` is {truncate_prompt_tokens}; it must be -1 (the model's maximum) "
            f"or between 1 and the model's maximum of {card.max_model_len}.",
            param="truncate_prompt_tokens",
        )
    return truncate_prompt_tokens


def too_long(index: int, length: int, card: ModelCard) -> ApiError:
    return bad_request(
        f"`input[{index}]` has {length} tokens, more than the model's maximum of {card.max_model_len}; "
        "shorten it or set `truncate_prompt_tokens`.",
        param=f"input[{index}]",
        code="context_length_exceeded",
    )


def tokenize_texts(
    texts: list[str], limit: int | None, tokenizer: TextTokenizer, card: ModelCard
) -> list[list[int]]:
    rows = tokenizer.encode(texts)
    if limit is not None and limit <= tokenizer.special_tokens:
        raise bad_request(
            f"`truncate_prompt_tokens` must leave room for text: at least {tokenizer.special_tokens + 1} "
            "for this model.",
            param="truncate_prompt_tokens",
        )
    for i, row in enumerate(rows):
        if limit is not None and len(row) > limit:
            rows[i] = tokenizer.encode_truncated(texts[i], limit)
        elif len(row) > card.max_model_len:
            raise too_long(i, len(row), card)
    return rows


def check_token_rows(rows: list[list[int]], limit: int | None, card: ModelCard) -> list[list[int]]:
    vocab = card.vocab_size
    for i, row in enumerate(rows):
        if min(row) < 0 or max(row) >= vocab:
            j = next(j for j, token in enumerate(row) if not 0 <= token < vocab)
            raise bad_request(
                f"`input[{i}][{j}]` is token id {row[j]}, outside the model's vocabulary of 0..{vocab - 1}.",
                param=f"input[{i}]",
            )
        if limit is not None:
            rows[i] = row[:limit]
        elif len(row) > card.max_model_len:
            raise too_long(i, len(row), card)
    return rows


def tokenize_embedding_request(
    request: EmbeddingRequest, tokenizer: TextTokenizer, card: ModelCard
) -> TokenizedInputs:
    if request.dimensions is not None and request.dimensions > card.hidden_size:
        raise bad_request(
            f"`dimensions` is {request.dimensions}; this model's embeddings have {card.hidden_size}.",
            param="dimensions",
        )
    texts, rows = split_input(request.input)
    limit = resolve_token_limit(request.truncate_prompt_tokens, card)
    rows = tokenize_texts(texts, limit, tokenizer, card) if texts else check_token_rows(rows, limit, card)
    lengths = [len(row) for row in rows]
    tokens = np.fromiter(itertools.chain.from_iterable(rows), dtype=TOKEN_DTYPE, count=sum(lengths))
    return TokenizedInputs(lengths=lengths, tokens=tokens.tobytes(), dimensions=request.dimensions or 0)
