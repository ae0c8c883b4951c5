"""Long inputs cut into windows (--long-input chunk, a request's `long_input`), as vLLM's chunked processing
cuts them: which inputs became how many engine rows, and how one input's rows become its answer again.

vLLM (serving_embedding.py, `enable_chunked_processing`) cuts the token ids of an input into pieces of the
model's maximum, sends each piece as a request of its own, and answers the token-weighted mean of the pieces'
vectors. Two things differ here, each for a reason docs/api.md ("Long inputs") gives: each window is tokenized
with the special tokens the tokenizer adds (vLLM's pieces hold the one [CLS] and [SEP] of the whole input, so
every piece but the first reads as no input the model was trained on), and the mean is taken of the vectors
before normalization and normalized after (vLLM averages normalized vectors and answers their mean as it is, a
vector shorter than 1). For mean pooling the result is the mean of every window's token states, normalized as
the model normalizes one input's.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from apiserver.errors import ApiError, bad_request
from apiserver.requests.inputs.text import CHUNK_INPUTS
from apiserver.requests.limits import TokenBudget
from apiserver.requests.tokenizer import TextTokenizer
from poolserve.config import Config
from poolserve.model_card import EMBEDDING, LongInput, ModelCard

F32 = npt.NDArray[np.float32]


@dataclass(frozen=True, slots=True)
class Chunking:
    """Over-long inputs are cut into windows, each repeating the last `overlap` tokens of the one before.
    `option`: what asked for it (named in refusals)."""

    overlap: int
    option: str


def long_input_mode(
    asked: LongInput | None, truncate_prompt_tokens: int | None, config: Config, *, cut: str = "truncate_prompt_tokens"
) -> tuple[int | None, Chunking | None]:
    """The request's truncation and chunking, from its `long_input`, its truncation (`cut` names it) and the
    server's --long-input: a truncation the request asks for is kept; one that says otherwise than its own
    `long_input` is refused, as two answers to one question."""
    if truncate_prompt_tokens is not None:
        if asked not in (None, "truncate"):
            raise bad_request(
                f"`long_input` is {asked!r} and `{cut}` is set: both say what a long input gets; send one.",
                param="long_input",
            )
        return truncate_prompt_tokens, None
    mode = asked or config.long_input
    if mode == "truncate":
        return -1, None
    if mode == "chunk":
        option = "long_input" if asked is not None else "--long-input"
        return None, Chunking(config.long_input_overlap, option)
    return None, None


def cannot_chunk(param: str, card: ModelCard, chunking: Chunking, reason: str) -> ApiError:
    return bad_request(
        f"`{param}` has more tokens than the model's maximum of {card.max_model_len}, and chunking it "
        f"({chunking.option} chunk) is not supported {reason}; shorten it or set `truncate_prompt_tokens`.",
        param=param,
        code="context_length_exceeded",
    )


def chunk_refusal(card: ModelCard, prompt: str, *, per_token: bool = False) -> str | None:
    """Why an embedding of this model's long inputs cannot be a mean of windows; None: it can. Only mean pooling
    makes the windows' token-weighted mean the mean of their tokens: vLLM's chunked processing assumes it (for
    CLS or last-token pooling its mean is of vectors each pooled from one window's first or last token)."""
    if per_token:
        return "for every token's state (only one vector per input is combined from windows)"
    if card.kind != EMBEDDING:
        return f"for a {card.kind} model (only embeddings are combined from windows)"
    if card.pooling != "mean":
        return (
            f"for a model that pools by {card.pooling!r}: only under mean pooling is the windows' token-weighted "
            "mean of vectors the mean of their tokens"
        )
    if prompt:
        return "for a text after a prompt (only the first window would hold it)"
    return None


def refuse_chunking(
    params: Sequence[str], rows: Sequence[Sequence[int]], card: ModelCard, chunking: Chunking, refusal: str | None
) -> None:
    """Token-id inputs past the maximum, where they cannot be chunked."""
    if refusal is None:
        return
    for param, row in zip(params, rows, strict=True):
        if len(row) > card.max_model_len:
            raise cannot_chunk(param, card, chunking, refusal)


def check_overlap(chunking: Chunking, room: int) -> None:
    """A window must hold a token the one before did not."""
    if chunking.overlap >= room:
        raise bad_request(
            f"--long-input-overlap is {chunking.overlap}, but a window of this model holds {room} text tokens: each "
            "window would repeat the whole one before. Ask the operator for a smaller overlap, or truncate.",
            param="long_input",
        )


@dataclass(slots=True)
class Windows:
    """How many engine rows (windows) each input became, in the engine's order, and each row's tokens."""

    counts: list[int]
    tokens: list[int]
    # Whether an input's mean is normalized (the engine then sends its windows' vectors unnormalized).
    normalize: bool = False

    @property
    def starts(self) -> npt.NDArray[np.int64]:
        return np.concatenate(([0], np.cumsum(self.counts[:-1], dtype=np.int64)))

    def mean(self, rows: F32) -> F32:
        """One row per input: the token-weighted mean of its windows' rows (in float64), normalized if asked."""
        weights = np.asarray(self.tokens, dtype=np.float64)[:, None]
        starts = self.starts
        means = np.add.reduceat(rows * weights, starts, axis=0) / np.add.reduceat(weights, starts, axis=0)
        if self.normalize:
            means /= np.maximum(np.sqrt(np.einsum("ij,ij->i", means, means)), 1e-12)[:, None]
        combined: F32 = means.astype(np.float32)
        return combined

    def best(self, scores: npt.NDArray[np.floating]) -> npt.NDArray[np.floating]:
        """One score per input: its best window's."""
        best: npt.NDArray[np.floating] = np.maximum.reduceat(scores, self.starts)
        return best


def flatten(pieces: Sequence[Sequence[list[int]]]) -> tuple[list[list[int]], Windows | None]:
    """The engine rows of inputs cut into windows, and the windows (None when every input is one)."""
    rows = [row for windows in pieces for row in windows]
    if len(rows) == len(pieces):
        return rows, None
    return rows, Windows([len(windows) for windows in pieces], [len(row) for row in rows])


def chunk_texts(
    texts: list[str],
    params: Sequence[str],
    tokenizer: TextTokenizer,
    card: ModelCard,
    chunking: Chunking,
    *,
    budget: TokenBudget | None,
    add_special_tokens: bool = True,
    refusal: str | None = None,
) -> list[list[list[int]]]:
    """Each text's windows (one for a text that fits). `refusal`: why this request's texts cannot be chunked
    (said when one is too long; None: they can)."""
    check_overlap(chunking, card.max_model_len - (tokenizer.special_tokens if add_special_tokens else 0))
    pieces: list[list[list[int]]] = []
    total = 0
    for begin in range(0, len(texts), CHUNK_INPUTS):
        group = texts[begin : begin + CHUNK_INPUTS]
        windowed = tokenizer.encode_windows(
            group, card.max_model_len, chunking.overlap, add_special_tokens=add_special_tokens
        )
        for k, windows in enumerate(windowed):
            if len(windows) > 1 and refusal is not None:
                raise cannot_chunk(params[begin + k], card, chunking, refusal)
            total += sum(len(row) for row in windows)
        pieces.extend(windowed)
        if budget is not None:
            budget.check(total, so_far=begin + CHUNK_INPUTS < len(texts))
    return pieces


def chunk_token_rows(rows: list[list[int]], card: ModelCard, chunking: Chunking) -> list[list[list[int]]]:
    """Token-id inputs are the client's own, special tokens and all: cut as they are, as vLLM cuts them."""
    size = card.max_model_len
    check_overlap(chunking, size)
    step = size - chunking.overlap
    pieces = []
    for row in rows:
        starts = [0]
        while starts[-1] + size < len(row):
            starts.append(starts[-1] + step)
        pieces.append([row[start : start + size] for start in starts])
    return pieces


def chunk_pairs(
    pairs: list[tuple[str, str]],
    tokenizer: TextTokenizer,
    card: ModelCard,
    chunking: Chunking,
    *,
    budget: TokenBudget | None,
    first_param: str = "query",
) -> tuple[list[list[int]], list[list[int]], Windows | None]:
    """A cross-encoder's pairs with long second texts (documents) cut into windows, the first text (the query)
    whole in each: rows, token type rows, and the windows of each pair."""
    for length in {tokenizer.count_tokens(first) for first in {first for first, _ in pairs}}:
        room = card.max_model_len - tokenizer.pair_special_tokens - length
        if room <= chunking.overlap:
            raise bad_request(
                f"`{first_param}` has {length} tokens, which leaves a window of this model's {card.max_model_len} "
                f"no room for a document's tokens beyond the {chunking.overlap} it repeats "
                "(--long-input-overlap); shorten it.",
                param=first_param,
                code="context_length_exceeded",
            )
    rows: list[list[int]] = []
    type_rows: list[list[int]] = []
    counts: list[int] = []
    total = 0
    for begin in range(0, len(pairs), CHUNK_INPUTS):
        group = pairs[begin : begin + CHUNK_INPUTS]
        for pieces in tokenizer.encode_pair_windows(group, card.max_model_len, chunking.overlap):
            counts.append(len(pieces))
            for ids, types in pieces:
                rows.append(ids)
                type_rows.append(types)
                total += len(ids)
        if budget is not None:
            budget.check(total, so_far=begin + CHUNK_INPUTS < len(pairs))
    windows = None if len(rows) == len(pairs) else Windows(counts, [len(row) for row in rows])
    return rows, type_rows, windows
