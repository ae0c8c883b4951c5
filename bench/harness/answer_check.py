"""A fixed catalogue of mixed requests and their reference answers, to check every answer under faults.

Pooling is a pure function of the request, so each catalogue entry has one right answer: the one an
unfaulted pass gave. An answer under faults that differs from its entry's reference (beyond float noise
from being batched with other inputs) is a request mixed up with another, or corrupted.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

from bench.harness.corpus import make_sentences

# Fields that differ from one answer to the next by design.
VOLATILE = frozenset({"id", "created"})
# One input's vector computed in another batch (other padding, other neighbours) moves by ~1e-6 in float32;
# another input's vector differs by ~1e-1.
TOLERANCE = 1e-4


@dataclass(frozen=True)
class Entry:
    kind: str  # for the report: which mix of endpoint and size
    path: str
    body: dict[str, Any]


def build_catalogue(seed: int = 0, per_kind: int = 24) -> list[Entry]:
    """`per_kind` distinct requests of each kind: /v1/embeddings with 1 and with 16 texts, /rerank of 8
    documents, TEI's /embed, and /tokenize in vLLM's and TEI's shapes."""
    rng = random.Random(seed)
    texts = make_sentences(per_kind * 32, seed=seed, min_words=4, max_words=40)
    take = iter(texts)
    entries: list[Entry] = []
    for index in range(per_kind):
        entries += [
            Entry("embeddings-1", "/v1/embeddings", {"input": next(take)}),
            Entry("embeddings-16", "/v1/embeddings", {"input": [next(take) for _ in range(16)]}),
            Entry("rerank-8", "/rerank", {"query": next(take), "documents": [next(take) for _ in range(8)]}),
            Entry("embed-tei", "/embed", {"inputs": [next(take) for _ in range(rng.choice((1, 4)))]}),
            Entry("tokenize-tei" if index % 2 else "tokenize", "/tokenize",
                  {"inputs": [next(take)]} if index % 2 else {"prompt": next(take)}),
        ]  # fmt: skip
    return entries


def differences(answer: Any, reference: Any, where: str = "$") -> list[str]:
    """Where `answer` departs from `reference`: floats beyond TOLERANCE, anything else unequal (fields in
    VOLATILE skipped). Empty when the answer is the reference's."""
    if isinstance(reference, dict):
        if not isinstance(answer, dict) or answer.keys() != reference.keys():
            return [f"{where}: keys {sorted(answer) if isinstance(answer, dict) else type(answer).__name__}"]
        return [
            found
            for key in reference
            if key not in VOLATILE
            for found in differences(answer[key], reference[key], f"{where}.{key}")
        ]
    if isinstance(reference, list):
        if not isinstance(answer, list) or len(answer) != len(reference):
            return [f"{where}: length {len(answer) if isinstance(answer, list) else type(answer).__name__}"]
        found: list[str] = []
        for index, (mine, theirs) in enumerate(zip(answer, reference, strict=True)):
            found += differences(mine, theirs, f"{where}[{index}]")
            if found:
                return found  # the first is enough to say it is wrong
        return found
    if isinstance(reference, float) and isinstance(answer, float | int) and not isinstance(answer, bool):
        return [] if abs(answer - reference) <= TOLERANCE else [f"{where}: {answer} vs {reference}"]
    return [] if answer == reference else [f"{where}: {answer!r} vs {reference!r}"]
