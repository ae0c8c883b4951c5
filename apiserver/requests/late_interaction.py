"""A late-interaction (ColBERT) model's requests: texts as queries or documents, and MaxSim scores.

sentence-transformers' MultiVectorEncoder treats a text by its role: `encode_query` puts the query prompt
first, cuts at the query length and expands (the engine adds the expansion tokens: engine_core/multi_vector.py);
`encode_document` puts the document prompt first and cuts at the document length; `encode` (no role) puts the
default prompt first and cuts at the model's maximum. Documents and texts without a role lose their skiplist
tokens' vectors. A query scores a document by MaxSim: for each query vector, its largest dot product with the
document's vectors, summed (`meanmaxsim`: averaged), as `MultiVectorEncoder.similarity` does.
"""

from __future__ import annotations

from collections.abc import Sequence

import msgspec
import numpy as np

from apiserver.requests.inputs.items import Item
from apiserver.requests.inputs.job import EngineJob, build_job, check_prompt_survives
from apiserver.requests.inputs.text import Truncation, tokenize_texts, with_second_cut
from apiserver.requests.limits import TokenBudget
from apiserver.requests.operation import Rows
from apiserver.requests.prompts import Role, role_prompt
from apiserver.requests.tokenizer import TextTokenizer
from poolserve.model_card import LateInteraction, ModelCard


def spec_of(card: ModelCard) -> LateInteraction:
    assert card.late_interaction is not None
    return card.late_interaction


def role_card(card: ModelCard, role: Role | None) -> ModelCard:
    """The card as a text of this role sees it: its maximum length is the role's cut (query_length,
    document_length), so that an over-long text is refused or truncated there, as everywhere, by the card."""
    spec = spec_of(card)
    length = {"query": spec.query_length, "document": spec.document_length}.get(role or "", card.max_model_len)
    return card if length == card.max_model_len else msgspec.structs.replace(card, max_model_len=length)


def role_limit(truncation: Truncation, card: ModelCard) -> int | None:
    """A truncation's limit within the role's cut (`truncate_prompt_tokens: -1` means the role's maximum)."""
    return None if truncation.limit is None else min(truncation.limit, card.max_model_len)


def vector_counts(card: ModelCard, rows: Sequence[Sequence[int]], queries: int) -> list[int]:
    """How many token vectors the engine answers for each input (the first `queries` of them queries)."""
    spec = spec_of(card)
    return [spec.vector_count(np.asarray(row, dtype=np.int64), i < queries) for i, row in enumerate(rows)]


def token_vectors_job(
    items: list[Item],
    card: ModelCard,
    tokenizer: TextTokenizer,
    role: Role | None,
    *,
    truncation: Truncation,
    params: Sequence[str] | None = None,
    budget: TokenBudget | None = None,
    add_special_tokens: bool = True,
    prompt: str | None = None,
) -> EngineJob:
    """The job of /pooling's token_embed or /embed_all: every input in `role` (None: as `encode` treats it),
    after the role's prompt unless `prompt` names another."""
    seen = role_card(card, role)
    job = build_job(
        items, seen, tokenizer, limit=role_limit(truncation, seen), params=params, direction=truncation.direction,
        option=truncation.option, budget=budget, add_special_tokens=add_special_tokens,
        prompt=role_prompt(card, role) if prompt is None else prompt,
    )  # fmt: skip
    return with_roles(job, card, queries=len(job.rows) if role == "query" else 0)


def with_roles(job: EngineJob, card: ModelCard, queries: int) -> EngineJob:
    job.params.per_token, job.params.queries = True, queries
    job.vector_counts = vector_counts(card, job.rows, queries)
    return job


def plan_late_scores(
    pairs: list[tuple[str, str]],
    params: Sequence[str],
    card: ModelCard,
    tokenizer: TextTokenizer,
    *,
    truncation: Truncation,
    budget: TokenBudget | None,
    second_tokens: int | None,
) -> tuple[EngineJob, list[int], list[int]]:
    """Each pair's first text as a query and its second as a document, each distinct text run once: the job
    (queries first), and each pair's query and document as inputs of it."""
    queries = list(dict.fromkeys(query for query, _ in pairs))
    documents = list(dict.fromkeys(document for _, document in pairs))
    # Each text's parameter (named in errors): where it first appears.
    first_query: dict[str, str] = {}
    first_document: dict[str, str] = {}
    for (query, document), param in zip(pairs, params, strict=True):
        first_query.setdefault(query, param)
        first_document.setdefault(document, param)
    query_params = [first_query[query] for query in queries]
    document_params = [first_document[document] for document in documents]
    rows: list[list[int]] = []
    sides: tuple[tuple[Role, list[str], list[str]], ...] = (
        ("query", queries, query_params),
        ("document", documents, document_params),
    )
    for role, texts, text_params in sides:
        seen = role_card(card, role)
        limit = role_limit(truncation, seen)
        prompt = role_prompt(card, role)
        if role == "document" and second_tokens is not None:  # Cohere's max_tokens_per_doc
            limit = with_second_cut(limit, second_tokens, prompt, tokenizer, seen.max_model_len)
        if prompt:
            check_prompt_survives(limit, truncation.direction, truncation.option)
        rows += tokenize_texts(
            [prompt + text for text in texts], text_params, limit, tokenizer, seen, direction=truncation.direction,
            option=truncation.option, budget=budget,
        )  # fmt: skip
    job = with_roles(EngineJob(rows=rows), card, queries=len(queries))
    query_of = {query: i for i, query in enumerate(queries)}
    document_of = {document: len(queries) + i for i, document in enumerate(documents)}
    return job, [query_of[q] for q, _ in pairs], [document_of[d] for _, d in pairs]


def maxsim_scores(matrices: list[Rows], left: list[int], right: list[int], spec: LateInteraction) -> list[float]:
    """MaxSim of each (query, document) pair of the job's token vectors, in float32 as sentence-transformers
    computes it."""
    scores = []
    for q, d in zip(left, right, strict=True):
        query, document = matrices[q], matrices[d]
        if not (len(query) and len(document)):  # a text with no vector (one token, bge-m3's CLS alone) matches nothing
            scores.append(0.0)
            continue
        best = (query @ document.T).max(axis=1)
        score = best.sum(dtype=np.float32)
        scores.append(float(score / len(query) if spec.similarity == "meanmaxsim" else score))
    return scores
