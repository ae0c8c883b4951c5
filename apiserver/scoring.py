"""Scoring text pairs: a cross-encoder reads each pair; a bi-encoder embeds both sides and takes the cosine."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from apiserver.inputs.job import EngineJob
from apiserver.inputs.text import Truncation, tokenize_pairs, tokenize_texts
from apiserver.limits import TokenBudget
from apiserver.operation import Rows
from apiserver.tokenizer import TextTokenizer
from poolserve.protocol import CLASSIFIER, ModelCard


@dataclass(slots=True)
class ScorePlan:
    """The engine job for some pairs, and how its rows become one score per pair."""

    job: EngineJob
    scores: Callable[[Rows], list[float]]


def plan_scores(
    pairs: list[tuple[str, str]],
    params: Sequence[str],
    card: ModelCard,
    tokenizer: TextTokenizer,
    *,
    truncation: Truncation,
    activation: bool = True,
    budget: TokenBudget | None = None,
    second_tokens: int | None = None,
) -> ScorePlan:
    """`second_tokens` (Cohere's `max_tokens_per_doc`): each pair's second text is cut to that many
    tokens (special tokens left out) before anything else."""
    if card.kind == CLASSIFIER:
        limit, direction, option = truncation.limit, truncation.direction, truncation.option
        rows, type_rows = tokenize_pairs(
            pairs, params, limit, tokenizer, card, direction=direction, option=option, budget=budget,
            second_tokens=second_tokens,
        )  # fmt: skip
        job = EngineJob(rows=rows, type_rows=type_rows if card.uses_token_types else None, activation=activation)
        return ScorePlan(job, lambda out: out[:, 0].tolist())
    # A bi-encoder: embed each distinct text once, normalized, and score by the dot product. With a cut
    # for second texts, a text on both sides is two texts.
    position: dict[tuple[bool, str], int] = {}
    text_params: list[str] = []
    for (first, second), param in zip(pairs, params, strict=True):
        for key in ((False, first), (second_tokens is not None, second)):
            if key not in position:
                position[key] = len(position)
                text_params.append(param)
    text_rows: list[list[int]] = [[] for _ in position]
    for is_cut in (False, True):
        keys = [key for key in position if key[0] == is_cut]
        if not keys:
            continue
        limit = truncation.limit
        if is_cut and second_tokens is not None:
            cut = second_tokens + tokenizer.special_tokens
            # A cut past the model's maximum changes nothing: the text is refused or truncated as without it.
            if limit is not None:
                limit = min(limit, cut)
            elif cut < card.max_model_len:
                limit = cut
        texts = tokenize_texts(
            [text for _, text in keys], [text_params[position[key]] for key in keys], limit, tokenizer, card,
            direction=truncation.direction, option=truncation.option, budget=budget,
        )  # fmt: skip
        for key, row in zip(keys, texts, strict=True):
            text_rows[position[key]] = row
    left = np.asarray([position[False, first] for first, _ in pairs])
    right = np.asarray([position[second_tokens is not None, second] for _, second in pairs])

    def cosine(vectors: Rows) -> list[float]:
        return np.einsum("ij,ij->i", vectors[left], vectors[right]).tolist()  # type: ignore[no-any-return]

    return ScorePlan(EngineJob(rows=text_rows, normalize=True), cosine)
