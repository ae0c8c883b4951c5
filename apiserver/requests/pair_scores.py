"""Scoring text pairs: a cross-encoder reads each pair; a bi-encoder embeds both sides and compares them with
the model's similarity function (cosine unless its Sentence-Transformers files say otherwise); a late-interaction
model scores a query's token vectors against a document's by MaxSim (apiserver/requests/late_interaction.py)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from apiserver.errors import bad_request
from apiserver.requests.inputs.job import EngineJob, check_prompt_survives, pooling_starts
from apiserver.requests.inputs.text import Truncation, tokenize_pairs, tokenize_texts, with_second_cut
from apiserver.requests.inputs.windows import Chunking, cannot_chunk, chunk_pairs, chunk_texts
from apiserver.requests.late_interaction import maxsim_scores, plan_late_scores, spec_of
from apiserver.requests.limits import TokenBudget
from apiserver.requests.operation import Rows
from apiserver.requests.pair_formats import tokenize_format_pairs
from apiserver.requests.pair_template import check_instruction, tokenize_rendered_pairs
from apiserver.requests.prompts import Role, adds_special_tokens, left_out_tokens, role_prompt, takes_query_route
from apiserver.requests.text_template import tokenize_rendered_texts
from apiserver.requests.tokenizer import TextTokenizer
from poolserve.model_card import CLASSIFIER, OUTPUT_MULTI_VECTOR, OUTPUT_SPARSE, SPARSE, ModelCard, Output, Similarity
from poolserve.protocol import PoolingParams, SparseRows


@dataclass(slots=True)
class ScorePlan:
    """The engine job for some pairs, and how its rows become one score per pair."""

    job: EngineJob
    scores: Callable[[Rows | SparseRows], list[float]]


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
    instruction: str | None = None,
    output: Output | None = None,
    chunking: Chunking | None = None,
    first_param: str = "query",
) -> ScorePlan:
    """`second_tokens` (Cohere's `max_tokens_per_doc`): each pair's second text is cut to that many
    tokens (special tokens left out) before anything else. `roles`: whether a bi-encoder embeds each side
    as a query or a document (its prompt: apiserver/requests/prompts.py); None: the default prompt. `instruction`: what
    a reranker's chat template puts before the pair (apiserver/requests/pair_template.py). `output`: which of the
    model's outputs scores the pairs (None: its own): bge-m3's lexical weights by their dot product, its ColBERT vectors
    by MaxSim. `chunking`: a document past the model's maximum is cut into windows and scored by its best window
    (apiserver/requests/inputs/windows.py); the query (`first_param`) must fit beside each."""
    if output is not None and output not in card.outputs:
        raise bad_request(
            f"`output` is {output!r}; this model's outputs are {', '.join(map(repr, card.outputs))}.", param="output"
        )
    late = card.is_late_interaction or output == OUTPUT_MULTI_VECTOR
    if chunking is not None and (card.pair_template or card.pair_format or late):
        if chunking.option == "long_input":  # asked by the request; the server's default leaves them as they were
            raise bad_request(
                "`long_input: chunk` is for embedders and BERT-style cross-encoders; this model reads its pairs "
                "through a prompt of its own, or scores them by token vectors: truncate instead.",
                param="long_input",
            )
        chunking = None
    if card.pair_template or card.pair_format:
        if second_tokens is not None:
            raise bad_request(
                "`max_tokens_per_doc` is not supported for a reranker that reads its pairs through a prompt of its "
                "own; truncate instead.",
                param="max_tokens_per_doc",
            )
        # Each reader checks the instruction against its own prompt.
        tokenize = tokenize_format_pairs if card.pair_format else tokenize_rendered_pairs
        rows = tokenize(pairs, params, truncation, tokenizer, card, instruction=instruction, budget=budget)
        return ScorePlan(EngineJob(rows=rows, params=PoolingParams(activation=activation)), first_column)
    check_instruction(card, instruction)  # a model that reads a pair as it is takes none
    if late:
        # A query against a document, whatever `roles` say: MaxSim is asymmetric.
        job, left, right = plan_late_scores(
            pairs, params, card, tokenizer, truncation=truncation, budget=budget, second_tokens=second_tokens
        )
        spec = spec_of(card)

        def late_scores(out: Rows | SparseRows) -> list[float]:
            assert not isinstance(out, SparseRows)  # token vectors are dense
            return maxsim_scores(job.token_outputs(out), left, right, spec)

        return ScorePlan(job, late_scores)
    if card.kind == CLASSIFIER and chunking is not None:
        rows, type_rows, windows = chunk_pairs(pairs, tokenizer, card, chunking, budget=budget, first_param=first_param)
        job = EngineJob(
            rows=rows,
            type_rows=type_rows if card.uses_token_types else None,
            params=PoolingParams(activation=activation),
        )
        if windows is None:
            return ScorePlan(job, first_column)
        found = windows

        def best_windows(out: Rows | SparseRows) -> list[float]:
            return found.best(np.asarray(first_column(out))).tolist()  # type: ignore[no-any-return]

        return ScorePlan(job, best_windows)
    if card.kind == CLASSIFIER:
        limit, direction, option = truncation.limit, truncation.direction, truncation.option
        rows, type_rows = tokenize_pairs(
            pairs, params, limit, tokenizer, card, direction=direction, option=option, budget=budget,
            second_tokens=second_tokens,
        )  # fmt: skip
        job = EngineJob(
            rows=rows,
            type_rows=type_rows if card.uses_token_types else None,
            params=PoolingParams(activation=activation),
        )
        return ScorePlan(job, first_column)
    return plan_similarities(
        pairs, params, card, tokenizer, truncation=truncation, budget=budget, second_tokens=second_tokens, roles=roles,
        sparse=output == OUTPUT_SPARSE and card.kind != SPARSE, chunking=chunking,
    )  # fmt: skip


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
    sparse: bool = False,
    chunking: Chunking | None = None,
) -> ScorePlan:
    """A bi-encoder's scores: embed each distinct text once (after its side's prompt) and compare the two
    sides as the model's similarity function says. A text on both sides is embedded twice where the sides'
    prompts differ or the second side is cut. `sparse`: compare the model's sparse output (bge-m3's lexical
    weights) by the dot product, as BGEM3FlagModel.compute_lexical_matching_score does. `chunking`: a long second
    text is embedded window by window, and a pair's score is its best window's."""
    if card.text_template is not None and second_tokens is not None:
        raise bad_request(
            "`max_tokens_per_doc` is not supported for a model that renders its texts through a chat template; "
            "truncate instead.",
            param="max_tokens_per_doc",
        )
    prompts = (role_prompt(card, roles[0]), role_prompt(card, roles[1]))
    query_route = (takes_query_route(card, roles[0]), takes_query_route(card, roles[1]))
    # The task a chat template reads, where it reads one: the side's role ("": none).
    reads_task = card.text_template is not None and card.text_template.takes_task
    tasks = (str(roles[0] or "") if reads_task else "", str(roles[1] or "") if reads_task else "")
    # A text's key: whether it takes a Router model's query chain, its template's task, its prompt, whether it is cut
    # (second_tokens), and itself; each key's parameter (named in errors) is where it first appears.
    first_param: dict[tuple[bool, str, str, bool, str], str] = {}
    pair_keys = []
    for pair, param in zip(pairs, params, strict=True):
        both = tuple(
            (query_route[side], tasks[side], prompts[side], side == 1 and second_tokens is not None, text)
            for side, text in enumerate(pair)
        )
        for key in both:
            first_param.setdefault(key, param)
        pair_keys.append(both)
    # The texts of a Router model's query chain go first (the job counts them: `queries`).
    position = {key: i for i, key in enumerate(sorted(first_param, key=lambda key: not key[0]))}
    text_params = [first_param[key] for key in position]
    sides = [[position[both[side]] for both in pair_keys] for side in (0, 1)]
    text_rows: list[list[list[int]]] = [[] for _ in position]  # each text's windows (one unless chunked)
    starts = [0] * len(position)
    for group in dict.fromkeys(key[:4] for key in position):
        keys = [key for key in position if key[:4] == group]
        is_query, task, prompt, is_cut = group
        group_params = [text_params[position[key]] for key in keys]
        if card.text_template is not None:
            rendered = tokenize_rendered_texts(
                [key[4] for key in keys], group_params, truncation, tokenizer, card, prompt=prompt, task=task or None,
                budget=budget,
            )  # fmt: skip
            for key, row in zip(keys, rendered, strict=True):
                text_rows[position[key]] = [row]
            continue
        special = adds_special_tokens(card, "query" if is_query else "document")
        limit = truncation.limit
        if is_cut and second_tokens is not None:
            limit = with_second_cut(limit, second_tokens, prompt, tokenizer, card.max_model_len)
        if prompt:
            check_prompt_survives(limit, truncation.direction, truncation.option)
        if chunking is not None and not is_cut:
            pieces = chunk_texts(
                [prompt + key[4] for key in keys], group_params, tokenizer, card, chunking, budget=budget,
                add_special_tokens=special, refusal=PROMPT_REFUSAL if prompt else None,
            )  # fmt: skip
        else:
            pieces = [[row] for row in tokenize_texts(
                [prompt + key[4] for key in keys], group_params, limit, tokenizer, card,
                direction=truncation.direction, option=truncation.option, budget=budget, add_special_tokens=special,
            )]  # fmt: skip
        texts = [windows[0] for windows in pieces]
        group_starts = pooling_starts(texts, group_params, left_out_tokens(card, prompt), truncation.option)
        for k, (key, windows) in enumerate(zip(keys, pieces, strict=True)):
            text_rows[position[key]] = windows
            starts[position[key]] = group_starts[k] if group_starts else 0
    counts = np.asarray([len(windows) for windows in text_rows])
    if chunking is not None:
        for key in dict.fromkeys(both[0] for both in pair_keys):
            if counts[position[key]] > 1:
                raise cannot_chunk(first_param[key], card, chunking, QUERY_REFUSAL)
    first_row = np.concatenate(([0], np.cumsum(counts)[:-1]))
    # Each pair as its first text's row against each window of its second, the best window's score kept.
    windows_of_second = counts[sides[1]]
    pair_starts = np.concatenate(([0], np.cumsum(windows_of_second)[:-1]))
    left = np.repeat(first_row[sides[0]], windows_of_second)
    right = np.repeat(first_row[sides[1]] - pair_starts, windows_of_second) + np.arange(int(windows_of_second.sum()))
    is_windowed = bool((windows_of_second > 1).any())
    compare = SIMILARITIES["dot" if sparse else card.similarity]

    def scores(vectors: Rows | SparseRows) -> list[float]:
        if isinstance(vectors, SparseRows):
            found = np.asarray(compare_sparse(vectors, left, right, compare))
        else:
            found = compare(vectors[left], vectors[right])
        if is_windowed:
            found = np.maximum.reduceat(found, pair_starts)
        return found.tolist()  # type: ignore[no-any-return]

    pooling = PoolingParams(
        normalize=None if sparse else normalize_for(card),
        sparse=sparse,
        queries=int(sum(counts[position[key]] for key in position if key[0])),
        pool_from=np.repeat(starts, counts).tolist() if any(starts) else [],
    )
    job = EngineJob(rows=[row for windows in text_rows for row in windows], params=pooling)
    return ScorePlan(job, scores)


# Why a text is not cut into windows for scoring (apiserver/requests/inputs/windows.py).
PROMPT_REFUSAL = "for a text after a prompt (only the first window would hold it)"
QUERY_REFUSAL = "for a query: only a document is cut into windows, its score the best window's"


def first_column(out: Rows | SparseRows) -> list[float]:
    """A cross-encoder's one logit per pair (a classifier's rows are never sparse)."""
    assert not isinstance(out, SparseRows)
    return out[:, 0].tolist()  # type: ignore[no-any-return]


# Pairs of sparse rows compared at once, each made dense (vocabulary-wide) for it: 64 x 30522 floats, 8 MB.
SPARSE_PAIRS_AT_ONCE = 64


def compare_sparse(
    vectors: SparseRows,
    left: npt.NDArray[np.int64],
    right: npt.NDArray[np.int64],
    compare: Callable[[Rows, Rows], Rows],
) -> list[float]:
    """The similarity of sparse rows, pair after pair as sentence-transformers' functions compute it on dense
    rows (SparseEncoder.similarity), without making every row dense at once."""
    scores: list[float] = []
    for start in range(0, len(left), SPARSE_PAIRS_AT_ONCE):
        end = start + SPARSE_PAIRS_AT_ONCE
        scores.extend(compare(vectors.dense_rows(left[start:end]), vectors.dense_rows(right[start:end])).tolist())
    return scores


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
