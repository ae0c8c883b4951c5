"""Scoring text pairs: a cross-encoder reads each pair; a bi-encoder embeds both sides and compares them with
the model's similarity function (cosine unless its Sentence-Transformers files say otherwise); a late-interaction
model scores a query's token vectors against a document's by MaxSim (apiserver/late_interaction.py)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from apiserver.inputs.job import EngineJob, check_prompt_survives
from apiserver.inputs.text import Truncation, tokenize_pairs, tokenize_texts, with_second_cut
from apiserver.late_interaction import maxsim_scores, plan_late_scores, spec_of
from apiserver.limits import TokenBudget
from apiserver.operation import Rows
from apiserver.prompts import Role, role_prompt
from apiserver.tokenizer import TextTokenizer
from poolserve.protocol import CLASSIFIER, ModelCard, Similarity


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
    roles: tuple[Role | None, Role | None] = (None, None),
) -> ScorePlan:
    """`second_tokens` (Cohere's `max_tokens_per_doc`): each pair's second text is cut to that many
    tokens (special tokens left out) before anything else. `roles`: whether a bi-encoder embeds each side
    as a query or a document (its prompt: apiserver/prompts.py); None: the default prompt."""
    if card.late_interaction is not None:
        # A query against a document, whatever `roles` say: MaxSim is asymmetric.
        job, left, right = plan_late_scores(
            pairs, params, card, tokenizer, truncation=truncation, budget=budget, second_tokens=second_tokens
        )
        spec = spec_of(card)
        return ScorePlan(job, lambda out: maxsim_scores(job.token_outputs(out), left, right, spec))
    if card.kind == CLASSIFIER:
        limit, direction, option = truncation.limit, truncation.direction, truncation.option
        rows, type_rows = tokenize_pairs(
            pairs, params, limit, tokenizer, card, direction=direction, option=option, budget=budget,
            second_tokens=second_tokens,
        )  # fmt: skip
        job = EngineJob(rows=rows, type_rows=type_rows if card.uses_token_types else None, activation=activation)
        return ScorePlan(job, lambda out: out[:, 0].tolist())
    return plan_similarities(
        pairs, params, card, tokenizer, truncation=truncation, budget=budget, second_tokens=second_tokens, roles=roles
    )


def plan_similarities(
    pairs: list[tuple[str, str]],
    params: Sequence[str],
    card: ModelCard,
    tokenizer: TextTokenizer,
    *,
    truncation: Truncation,
    budget: TokenBudget | None,
    second_tokens: int | None,
    roles: tuple[Role | None, Role | None],
) -> ScorePlan:
    """A bi-encoder's scores: embed each distinct text once (after its side's prompt) and compare the two
    sides as the model's similarity function says. A text on both sides is embedded twice where the sides'
    prompts differ or the second side is cut."""
    prompts = (role_prompt(card, roles[0]), role_prompt(card, roles[1]))
    # A text's key: its prompt, whether it is cut (second_tokens), and itself.
    position: dict[tuple[str, bool, str], int] = {}
    text_params: list[str] = []
    sides: list[list[int]] = [[], []]
    for pair, param in zip(pairs, params, strict=True):
        for side, text in enumerate(pair):
            key = (prompts[side], side == 1 and second_tokens is not None, text)
            if key not in position:
                position[key] = len(position)
                text_params.append(param)
            sides[side].append(position[key])
    text_rows: list[list[int]] = [[] for _ in position]
    for group in dict.fromkeys((prompt, is_cut) for prompt, is_cut, _ in position):
        keys = [key for key in position if key[:2] == group]
        prompt, is_cut = group
        limit = truncation.limit
        if is_cut and second_tokens is not None:
            limit = with_second_cut(limit, second_tokens, prompt, tokenizer, card.max_model_len)
        if prompt:
            check_prompt_survives(limit, truncation.direction, truncation.option)
        texts = tokenize_texts(
            [prompt + text for _, _, text in keys], [text_params[position[key]] for key in keys], limit, tokenizer,
            card, direction=truncation.direction, option=truncation.option, budget=budget,
        )  # fmt: skip
        for key, row in zip(keys, texts, strict=True):
            text_rows[position[key]] = row
    left, right = np.asarray(sides[0]), np.asarray(sides[1])
    compare = SIMILARITIES[card.similarity]

    def scores(vectors: Rows) -> list[float]:
        return compare(vectors[left], vectors[right]).tolist()  # type: ignore[no-any-return]

    return ScorePlan(EngineJob(rows=text_rows, normalize=normalize_for(card)), scores)


def normalize_for(card: ModelCard) -> bool | None:
    """What a bi-encoder's rows are compared as: normalized for the cosine (a dot product then, to float noise);
    as the model makes them (None) for the other functions."""
    return True if card.similarity == "cosine" else None


def rowwise_dot(a: Rows, b: Rows) -> Rows:
    dots: Rows = np.einsum("ij,ij->i", a, b)
    return dots


def rowwise_cosine(a: Rows, b: Rows) -> Rows:
    """The dot product of the rows normalized (the engine sends them normalized: then it is one to float noise)."""
    norms = np.sqrt(np.einsum("ij,ij->i", a, a) * np.einsum("ij,ij->i", b, b))
    cosines: Rows = rowwise_dot(a, b) / np.maximum(norms, 1e-12)
    return cosines


def negative_euclidean(a: Rows, b: Rows) -> Rows:
    difference = a - b
    distances: Rows = np.sqrt(np.einsum("ij,ij->i", difference, difference))
    return -distances


def negative_manhattan(a: Rows, b: Rows) -> Rows:
    distances: Rows = np.abs(a - b).sum(axis=1)
    return -distances


# sentence-transformers' similarity functions of two embeddings (`similarity_fn_name`), the rows of `a` against
# those of `b`.
SIMILARITIES: dict[Similarity, Callable[[Rows, Rows], Rows]] = {
    "cosine": rowwise_cosine,
    "dot": rowwise_dot,
    "euclidean": negative_euclidean,
    "manhattan": negative_manhattan,
}
