"""Token rows from texts, text pairs and token-id lists, within the model's length limits."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from apiserver.errors import ApiError, bad_request
from apiserver.tokenizer import Direction, TextTokenizer
from poolserve.protocol import ModelCard


@dataclass(frozen=True, slots=True)
class Truncation:
    """How an over-long input is cut: to `limit` tokens (None: it is refused instead), from which side,
    and the request option that asked for it (named in errors)."""

    limit: int | None
    direction: Direction = "right"
    option: str = "truncate_prompt_tokens"


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


def vllm_truncation(truncate_prompt_tokens: int | None, card: ModelCard) -> Truncation:
    """vLLM's `truncate_prompt_tokens`: -1 for the model's maximum, k for k tokens; always from the right."""
    return Truncation(resolve_token_limit(truncate_prompt_tokens, card))


def tei_truncation(truncate: bool | None, truncation_direction: str, card: ModelCard) -> Truncation:
    """TEI's `truncate` (to the model's maximum) and `truncation_direction` (`Left`/`Right`, any case)."""
    direction: Direction = "left" if truncation_direction.lower() == "left" else "right"
    return Truncation(card.max_model_len if truncate else None, direction, "truncate")


def too_long(param: str, length: int, card: ModelCard, fix: str) -> ApiError:
    return bad_request(
        f"`{param}` has {length} tokens, more than the model's maximum of {card.max_model_len}; shorten it or {fix}.",
        param=param,
        code="context_length_exceeded",
    )


def check_room(limit: int | None, special_tokens: int, option: str) -> None:
    if limit is not None and limit <= special_tokens:
        raise bad_request(
            f"`{option}` must leave room for text: at least {special_tokens + 1} for this model.",
            param=option,
        )


def tokenize_texts(
    texts: list[str],
    params: Sequence[str],
    limit: int | None,
    tokenizer: TextTokenizer,
    card: ModelCard,
    *,
    direction: Direction = "right",
    option: str = "truncate_prompt_tokens",
) -> list[list[int]]:
    """Token ids of each text; over-long texts are cut to `limit` when there is one, else refused."""
    check_room(limit, tokenizer.special_tokens, option)
    rows = tokenizer.encode(texts)
    for i, row in enumerate(rows):
        if limit is not None and len(row) > limit:
            rows[i] = tokenizer.encode_truncated(texts[i], limit, direction)
        elif len(row) > card.max_model_len:
            raise too_long(params[i], len(row), card, f"set `{option}`")
    return rows


def tokenize_pairs(
    pairs: list[tuple[str, str]],
    params: Sequence[str],
    limit: int | None,
    tokenizer: TextTokenizer,
    card: ModelCard,
    *,
    direction: Direction = "right",
    option: str = "truncate_prompt_tokens",
) -> tuple[list[list[int]], list[list[int]]]:
    """Ids and token type ids of each pair, as a cross-encoder reads them."""
    check_room(limit, tokenizer.pair_special_tokens + 1, option)
    rows, type_rows = tokenizer.encode_pairs(pairs, limit, direction)
    for i, row in enumerate(rows):
        if len(row) > card.max_model_len:
            raise too_long(params[i], len(row), card, f"set `{option}`")
    return rows, type_rows


def check_token_rows(
    rows: list[list[int]], params: Sequence[str], limit: int | None, card: ModelCard
) -> list[list[int]]:
    """Token-id inputs are used as given: in the vocabulary, within the length limit (or cut to it)."""
    vocab = card.vocab_size
    checked = []
    for i, row in enumerate(rows):
        if min(row) < 0 or max(row) >= vocab:
            j = next(j for j, token in enumerate(row) if not 0 <= token < vocab)
            raise bad_request(
                f"`{params[i]}[{j}]` is token id {row[j]}, outside the model's vocabulary of 0..{vocab - 1}.",
                param=params[i],
            )
        if limit is None and len(row) > card.max_model_len:
            raise too_long(params[i], len(row), card, "set `truncate_prompt_tokens`")
        checked.append(row if limit is None else row[:limit])
    return checked
