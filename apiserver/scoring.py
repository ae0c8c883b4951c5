"""Scoring text pairs: a cross-encoder reads each pair; a bi-encoder embeds both sides and takes the cosine."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from apiserver.inputs.job import EngineJob
from apiserver.inputs.text import tokenize_pairs, tokenize_texts
from apiserver.pipeline import F32
from apiserver.tokenizer import Direction, TextTokenizer
from poolserve.protocol import CLASSIFIER, ModelCard


@dataclass(slots=True)
class ScorePlan:
    """The engine job for some pairs, and how its rows become one score per pair."""

    job: EngineJob
    scores: Callable[[F32], list[float]]


def plan_scores(
    pairs: list[tuple[str, str]],
    params: Sequence[str],
    card: ModelCard,
    tokenizer: TextTokenizer,
    *,
    limit: int | None,
    activation: bool = True,
    direction: Direction = "right",
    option: str = "truncate_prompt_tokens",
) -> ScorePlan:
    if card.kind == CLASSIFIER:
        rows, type_rows = tokenize_pairs(pairs, params, limit, tokenizer, card, direction=direction, option=option)
        job = EngineJob(rows=rows, type_rows=type_rows if card.uses_token_types else None, activation=activation)
        return ScorePlan(job, lambda out: out[:, 0].tolist())
    # A bi-encoder: embed each distinct text once, normalized, and score by the dot product.
    position: dict[str, int] = {}
    text_params: list[str] = []
    for (first, second), param in zip(pairs, params, strict=True):
        for text in (first, second):
            if text not in position:
                position[text] = len(position)
                text_params.append(param)
    rows = tokenize_texts(list(position), text_params, limit, tokenizer, card, direction=direction, option=option)
    left = np.asarray([position[first] for first, _ in pairs])
    right = np.asarray([position[second] for _, second in pairs])

    def cosine(vectors: F32) -> list[float]:
        return np.einsum("ij,ij->i", vectors[left], vectors[right]).tolist()  # type: ignore[no-any-return]

    return ScorePlan(EngineJob(rows=rows, normalize=1), cosine)
