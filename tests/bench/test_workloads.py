from __future__ import annotations

import json

import pytest

from bench.harness.corpus import make_sentences
from bench.harness.workloads import build_workload, resolve_name


def test_corpus_is_deterministic_and_sentences_have_10_to_40_words() -> None:
    sentences = make_sentences(300, seed=7)
    assert sentences == make_sentences(300, seed=7)
    assert sentences != make_sentences(300, seed=8)
    counts = [len(s.split()) for s in sentences]
    # A sentence may carry one extra number among its words.
    assert min(counts) >= 10 and max(counts) <= 41
    assert all(s[0].isupper() and s[-1] in ".?" for s in sentences)


def test_letters_name_the_issue_workloads() -> None:
    assert [resolve_name(x) for x in "abcd"] == ["short", "batch16", "image", "long"]
    with pytest.raises(ValueError, match="unknown workload"):
        resolve_name("e")


def test_text_bodies_are_openai_embeddings_requests() -> None:
    short = build_workload("a", model_name="m")
    body = json.loads(short.bodies[0])
    assert body["model"] == "m" and len(body["input"]) == 1 and short.items_per_request == 1
    batch = build_workload("b")
    assert all(len(json.loads(b)["input"]) == 16 for b in batch.bodies)
    assert "model" not in json.loads(batch.bodies[0])
