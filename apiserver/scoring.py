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
) -> ScorePlan:
    if card.kind == CLASSIFIER:
        limit, direction, option = truncation.limit, truncation.direction, truncation.option
        rows, type_rows = tokenize_pairs(
            pairs, params, limit, tokenizer, card, direction=direction, option=option, budget=budget
        )
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
    rows = tokenize_texts(
        list(position), text_params, truncation.limit, tokenizer, card,
        direction=truncation.direction, option=truncation.option, budget=budget,
    )  # fmt: skip
    left = np.asarray([position[first] for first, _ in pairs])
    right = np.asarray([position[second] for _, second in pairs])

    def cosine(vectors: Rows) -> list[float]:
        return np.einsum("ij,ij->i", vectors[left], vectors[right]).tolist()  # type: ignore[no-any-return]

    return ScorePlan(EngineJob(rows=rows, normalize=True), cosine)
