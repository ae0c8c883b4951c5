"""The chaos soak (bench/chaos_soak.py): its answer check, and a brief run against the real server."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.chaos_soak import run_soak
from bench.harness.answer_check import build_catalogue, differences
from bench.harness.models import build_tiny512
from tests.utils import FLOAT32_CPU


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 2-layer, 32-wide BERT: the soak checks processes and answers, not a model's speed."""
    folder = tmp_path_factory.mktemp("soak-bert")
    build_tiny512(folder)
    return folder


def test_an_answer_is_held_to_its_reference_within_float_noise_only() -> None:
    reference = {"id": "a", "data": [{"index": 0, "embedding": [0.25, -0.5]}], "usage": {"prompt_tokens": 3}}
    noisy = {"id": "b", "data": [{"index": 0, "embedding": [0.25 + 1e-6, -0.5]}], "usage": {"prompt_tokens": 3}}
    other = {"id": "a", "data": [{"index": 0, "embedding": [0.3, -0.5]}], "usage": {"prompt_tokens": 3}}
    assert differences(noisy, reference) == []
    assert differences(other, reference) == ["$.data[0].embedding[0]: 0.3 vs 0.25"]
    assert differences({"tokens": [101, 7592, 102]}, {"tokens": [101, 2088, 102]}) != []
    assert differences([[1.0], [2.0]], [[1.0]]) != []


def test_the_catalogue_mixes_every_endpoint_and_size_and_no_two_requests_are_alike() -> None:
    catalogue = build_catalogue(per_kind=6)
    assert {entry.kind for entry in catalogue} == {
        "embeddings-1", "embeddings-16", "rerank-8", "embed-tei", "tokenize", "tokenize-tei",
    }  # fmt: skip
    assert len({str(entry.body) for entry in catalogue}) == len(catalogue)


def test_a_brief_chaos_soak_answers_every_request_right(tiny_model: Path) -> None:
    """A few seconds of it: API servers and the engine killed (a restart is a fork of the engine template, no torch
    import: engine_core/template.py), SIGHUP, SIGTTIN/SIGTTOU, SIGSTOP/SIGCONT."""
    report = run_soak(
        seconds=8, clients=4, interval=(0.5, 1.0), kinds=("kill-api-server", "kill-engine", "sighup", "ttin-ttou",
        "stop-cont"),
        sample_every=1.0, per_kind=4, warm_after=0,
        server_args=("--api-server-count", "2", "--model", str(tiny_model), *FLOAT32_CPU),
    )  # fmt: skip
    assert report["sent"] > 0 and len(report["faults"]) >= 2, report
    assert (report["failed"], report["mixed_up"]) == (0, 0), report
    assert report["supervisor_alive_at_end"], report
    assert {row["role"] for row in report["processes"]} >= {"supervisor", "apiserver", "engine"}, report
