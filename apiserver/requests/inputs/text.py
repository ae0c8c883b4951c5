"""Token rows from texts, text pairs and token-id lists, within the model's length limits."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from tokenizers import Encoding

from apiserver.errors import ApiError, bad_request
from apiserver.requests.limits import TokenBudget
from apiserver.requests.tokenizer import Content, Direction, TextTokenizer, longest_first, window_width
from poolserve.model_card import ModelCard


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


def vllm_truncation(truncate_prompt_tokens: int | None, card: ModelCard, side: Direction | None = None) -> Truncation:
    """vLLM's `truncate_prompt_tokens`: -1 for the model's maximum, k for k tokens; from the right (keeping
    the first tokens) unless `truncation_side` says "left"."""
    return Truncation(resolve_token_limit(truncate_prompt_tokens, card), side or "right")


def tei_truncation(truncate: bool | None, truncation_direction: str, card: ModelCard) -> Truncation:
    """TEI's `truncate` (to the model's maximum) and `truncation_direction` (`Left`/`Right`, any case)."""
    direction: Direction = "left" if truncation_direction.lower() == "left" else "right"
    return Truncation(card.max_model_len if truncate else None, direction, "truncate")


def too_long(param: str, length: int | str, card: ModelCard, fix: str) -> ApiError:
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


def with_second_cut(
    limit: int | None, second_tokens: int, prompt: str, tokenizer: TextTokenizer, max_model_len: int
) -> int | None:
    """A truncation limit with Cohere's `max_tokens_per_doc` applied: the document's own tokens, with its prompt and
    special tokens beside them. A cut past the maximum changes nothing: the text is refused or truncated as
    without it."""
    cut = second_tokens + tokenizer.special_tokens + (tokenizer.count_tokens(prompt) if prompt else 0)
    if limit is not None:
        return min(limit, cut)
    return cut if cut < max_model_len else None


# Texts are tokenized this many at a time, so a request past its token budget stops at the chunk that passes it.
CHUNK_INPUTS = 128


def tokenize_texts(
    texts: list[str],
    params: Sequence[str],
    limit: int | None,
    tokenizer: TextTokenizer,
    card: ModelCard,
    *,
    direction: Direction = "right",
    option: str = "truncate_prompt_tokens",
    budget: TokenBudget | None = None,
    add_special_tokens: bool = True,
) -> list[list[int]]:
    """Token ids of each text; over-long texts are cut to `limit` when there is one, else refused.
    `add_special_tokens=False` (vLLM's option): the text's own tokens only, the limit counting them alone.

    A text longer than a window (apiserver/requests/tokenizer.py) is tokenized only as far as can matter: to
    the tokens truncation keeps, or, without truncation, to one past the model's maximum, which
    proves it too long."""
    special_tokens = tokenizer.special_tokens if add_special_tokens else 0
    check_room(limit, special_tokens, option)
    need = (card.max_model_len + 1 if limit is None else limit) - special_tokens
    width = window_width(need)
    rows: list[list[int]] = []
    total = 0
    for begin in range(0, len(texts), CHUNK_INPUTS):
        chunk = range(begin, min(begin + CHUNK_INPUTS, len(texts)))
        short = [i for i in chunk if len(texts[i]) <= width]
        encoded = (
            dict(
                zip(
                    short,
                    tokenizer.encode([texts[i] for i in short], add_special_tokens=add_special_tokens),
                    strict=True,
                )
            )
            if short
            else {}
        )
        for i in chunk:
            row = (
                encoded[i]
                if i in encoded
                else long_text_row(
                    texts[i],
                    params[i],
                    need,
                    limit,
                    tokenizer,
                    card=card,
                    direction=direction,
                    option=option,
                    add_special_tokens=add_special_tokens,
                )
            )
            if limit is not None and len(row) > limit:
                row = tokenizer.encode_truncated(texts[i], limit, direction, add_special_tokens=add_special_tokens)
            elif len(row) > card.max_model_len:
                raise too_long(params[i], len(row), card, f"set `{option}`")
            rows.append(row)
            total += len(row)
        if budget is not None:
            budget.check(total, so_far=chunk.stop < len(texts))
    return rows


def long_text_row(
    text: str,
    param: str,
    need: int,
    limit: int | None,
    tokenizer: TextTokenizer,
    *,
    card: ModelCard,
    direction: Direction,
    option: str,
    add_special_tokens: bool = True,
) -> list[int]:
    content = tokenizer.encode_content(text, need, direction)
    if limit is None and not content.is_whole:
        raise too_long(param, f"more than {card.max_model_len}", card, f"set `{option}`")
    return tokenizer.finish(content, max_tokens=limit, direction=direction, add_special_tokens=add_special_tokens).ids


def tokenize_pairs(
    pairs: list[tuple[str, str]],
    params: Sequence[str],
    limit: int | None,
    tokenizer: TextTokenizer,
    card: ModelCard,
    *,
    direction: Direction = "right",
    option: str = "truncate_prompt_tokens",
    budget: TokenBudget | None = None,
    second_tokens: int | None = None,
) -> tuple[list[list[int]], list[list[int]]]:
    """Ids and token type ids of each pair, as a cross-encoder reads them; long pairs as far as can matter.
    `second_tokens` (Cohere's `max_tokens_per_doc`): each second text is first cut to that many tokens."""
    check_room(limit, tokenizer.pair_special_tokens + 1, option)
    room = (card.max_model_len if limit is None else limit) - tokenizer.pair_special_tokens
    width = window_width(room + 1)
    rows: list[list[int]] = []
    type_rows: list[list[int]] = []
    total = 0
    for begin in range(0, len(pairs), CHUNK_INPUTS):
        chunk = range(begin, min(begin + CHUNK_INPUTS, len(pairs)))
        capped = {}
        if second_tokens is not None:
            capped = {i: cut for i in chunk if (cut := cut_content(pairs[i][1], second_tokens, tokenizer, direction))}
        short = [i for i in chunk if len(pairs[i][0]) + len(pairs[i][1]) <= width and i not in capped]
        encoded = tokenizer.encode_pairs([pairs[i] for i in short], limit, direction) if short else ([], [])
        by_index = {i: (ids, types) for i, ids, types in zip(short, *encoded, strict=True)}
        for i in chunk:
            if i in by_index:
                row, types = by_index[i]
            else:
                encoding = long_pair(
                    pairs[i], params[i], room, limit, tokenizer, card=card, direction=direction, option=option,
                    second=capped.get(i),
                )  # fmt: skip
                row, types = encoding.ids, encoding.type_ids
            if len(row) > card.max_model_len:
                raise too_long(params[i], len(row), card, f"set `{option}`")
            rows.append(row)
            type_rows.append(types)
            total += len(row)
        if budget is not None:
            budget.check(total, so_far=chunk.stop < len(pairs))
    return rows, type_rows


def long_pair(
    pair: tuple[str, str],
    param: str,
    room: int,
    limit: int | None,
    tokenizer: TextTokenizer,
    *,
    card: ModelCard,
    direction: Direction,
    option: str,
    second: Content | None = None,
) -> Encoding:
    """A pair's encoding, from windows where that provably gives the same tokens as tokenizing it whole.

    tokenizers' `longest_first` (tokenizer.longest_first) cuts a pair by the shorter side's length
    and by which side is longer. With one side whole and the other's window longer than both it and
    the room, both are known. With both sides past the room, each keeps half the room, and only an
    odd room's extra token depends on which is longer: then both are counted whole (with the GIL
    released; tokenizers' own truncation of two long sides builds every combination of their
    overflowing pieces, quadratic in their lengths)."""
    first, second_text = pair
    a = tokenizer.encode_content(first, room + 1, direction)
    b = tokenizer.encode_content(second_text, room + 1, direction) if second is None else second
    if limit is None:
        if not (a.is_whole and b.is_whole):
            raise too_long(param, f"more than {card.max_model_len}", card, f"set `{option}`")
        return tokenizer.finish(a, b)
    if a.is_whole and b.is_whole:
        return tokenizer.finish(a, b, max_tokens=limit, direction=direction)
    if not b.is_whole and a.is_whole and len(b) <= len(a):
        b = tokenizer.encode_content(second_text, len(a) + 1, direction)
    if not a.is_whole and b.is_whole and len(a) <= len(b):
        a = tokenizer.encode_content(first, len(b) + 1, direction)
    lengths = len(a), len(b)
    if not a.is_whole and not b.is_whole and room % 2:
        lengths = tokenizer.count_tokens(first), tokenizer.count_tokens(second_text)
    return tokenizer.finish_pair_cut(a, b, longest_first(*lengths, room), direction)


def cut_content(text: str, tokens: int, tokenizer: TextTokenizer, direction: Direction) -> Content | None:
    """The text's first (`right`) or last (`left`) `tokens` tokens, special tokens left out, as whole content;
    None when it has no more than that."""
    content = tokenizer.encode_content(text, tokens + 1, direction)
    if len(content.encoding) <= tokens:
        return None
    content.encoding.truncate(tokens, direction=direction)
    return Content(content.encoding, tokens)


def check_token_rows(
    rows: list[list[int]], params: Sequence[str], limit: int | None, card: ModelCard, direction: Direction = "right"
) -> list[list[int]]:
    """Token-id inputs are used as given: in the vocabulary, within the length limit (or cut to it, keeping the
    first ids, or the last where `direction` is left)."""
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
        if limit is not None and len(row) > limit:
            row = row[-limit:] if direction == "left" else row[:limit]  # noqa: PLW2901 - the row as cut
        checked.append(row)
    return checked
