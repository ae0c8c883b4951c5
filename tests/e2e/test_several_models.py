"""Several models behind one `launch`: the bundled MiniLM and a tiny cross-encoder, each with its own engine, each
request routed by its `model` field; the answers are the one-model servers' own, and one model's engine crash
costs the other nothing. A model whose only engine crash-loops, taken out of service while the other serves, is
the supervisor's decision: tests/supervisor/test_arbiter.py, on stub children."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from bench.server_process import wait_until
from bench.steady_load import SteadyLoad
from tests.sentences import SENTENCES
from tests.utils import FLOAT32_CPU, LaunchedServer, engine_pids, ready_line_time

QUERY = "what is the capital of france?"
DOCUMENTS = [
    "Paris is the capital and most populous city of France.",
    "Berlin is the capital of Germany.",
    "Croissants are a French pastry.",
]


@pytest.fixture(scope="module")
def two_models(bundled_model: Path, cross_encoder_model: Path) -> Iterator[LaunchedServer]:
    """minilm (the default: engine-0) and rerank (engine-1), one API server."""
    server = LaunchedServer(
        "--model", f"minilm={bundled_model}", "--model", f"rerank={cross_encoder_model}",
        "--api-server-count", "1", *FLOAT32_CPU,
    ).wait_ready(120)  # fmt: skip
    try:
        yield server
    finally:
        server.stop()


def post(server: LaunchedServer, path: str, body: dict[str, Any]) -> Any:
    with server.client() as client:
        response = client.post(path, json=body)
    assert response.status_code == 200, response.text
    return response.json()


def vectors(answer: Any) -> np.ndarray:
    return np.asarray([item["embedding"] for item in answer["data"]], dtype=np.float32)


def scores(answer: Any) -> list[tuple[int, float]]:
    return [(item["index"], item["relevance_score"]) for item in answer["results"]]


def test_each_model_answers_as_its_own_one_model_server(
    two_models: LaunchedServer, server: LaunchedServer, cross_encoder_server: LaunchedServer
) -> None:
    texts = SENTENCES[:8]
    alone = vectors(post(server, "/v1/embeddings", {"input": texts}))
    named = post(two_models, "/v1/embeddings", {"input": texts, "model": "minilm"})
    assert named["model"] == "minilm"
    np.testing.assert_allclose(vectors(named), alone, atol=1e-6, rtol=0)
    # No `model` field, and TEI's route that has none: the default model.
    np.testing.assert_allclose(vectors(post(two_models, "/v1/embeddings", {"input": texts})), alone, atol=1e-6, rtol=0)
    np.testing.assert_allclose(
        np.asarray(post(two_models, "/embed", {"inputs": texts}), dtype=np.float32), alone, atol=1e-6, rtol=0
    )
    ranking = {"query": QUERY, "documents": DOCUMENTS}
    for path in ("/rerank", "/v1/rerank", "/v2/rerank"):
        want = scores(post(cross_encoder_server, path, ranking))
        got = post(two_models, path, {**ranking, "model": "rerank"})
        assert got["model"] == "rerank"
        assert [index for index, _ in scores(got)] == [index for index, _ in want]
        np.testing.assert_allclose([s for _, s in scores(got)], [s for _, s in want], atol=1e-6, rtol=0)


def test_an_unknown_model_is_a_404_listing_the_served_names_in_the_route_s_style(two_models: LaunchedServer) -> None:
    with two_models.client() as client:
        for path, body in (
            ("/v1/embeddings", {"input": "hello", "model": "nope"}),  # OpenAI's
            ("/v2/rerank", {"query": QUERY, "documents": DOCUMENTS, "model": "nope"}),  # Cohere's
            ("/v1/rerank", {"query": QUERY, "documents": DOCUMENTS, "model": "nope"}),  # Jina's
        ):
            response = client.post(path, json=body)
            assert response.status_code == 404, (path, response.text)
            error = response.json()["error"]
            assert error["code"] == "model_not_found", error
            assert "'minilm', 'rerank'" in error["message"], error
        # A route the model cannot serve is refused as on a one-model server.
        refused = client.post("/v1/embeddings", json={"input": "hello", "model": "rerank"})
        assert refused.status_code == 400 and refused.json()["error"]["code"] == "task_not_supported", refused.text


def test_models_info_and_health_list_every_model(two_models: LaunchedServer, cross_encoder_model: Path) -> None:
    with two_models.client() as client:
        listed = client.get("/v1/models").json()["data"]
        assert [(entry["id"], entry["kind"]) for entry in listed] == [("minilm", "embedding"), ("rerank", "classifier")]
        assert listed[1]["root"] == str(cross_encoder_model)
        info = client.get("/info").json()
        assert info["model_id"] == "minilm"
        assert [model["model_id"] for model in info["models"]] == ["minilm", "rerank"]
        assert "reranker" in info["models"][1]["model_type"]
        health = client.get("/health/ready")
        assert health.status_code == 200 and set(health.json()["models"]) == {"minilm", "rerank"}, health.text


def test_a_killed_engine_of_one_model_leaves_the_other_answering(two_models: LaunchedServer) -> None:
    """engine-1 (rerank) killed under load on both models: the embedder's requests all succeed, the reranker's are
    resubmitted to its restarted engine, and /health/ready names the model that is down meanwhile."""
    server = two_models
    victim = engine_pids(server)["1"]
    embedder = engine_pids(server)["0"]
    ranking = {"query": QUERY, "documents": DOCUMENTS, "model": "rerank"}
    down: list[str] = []

    def names_the_model() -> bool:
        with server.client() as client:
            health = client.get("/health/ready")
        if health.status_code == 503:
            down.append(health.json()["error"]["message"])
        return bool(down)

    with (
        SteadyLoad(server.url, clients=2, body={"input": SENTENCES[:4], "model": "minilm"}) as embeds,
        SteadyLoad(server.url, clients=1, body=ranking, path="/v1/rerank") as reranks,
    ):
        embeds.wait_for(4)
        reranks.wait_for(2)
        os.kill(victim, signal.SIGKILL)
        at_kill = sum(embeds.statuses.values())
        assert wait_until(names_the_model, 10), server.log()
        ready_line_time(server, "engine-1", victim, timeout=90)
        served_meanwhile = sum(embeds.statuses.values()) - at_kill
        reranks.wait_for(sum(reranks.statuses.values()) + 2)
        embeds.wait_for(sum(embeds.statuses.values()) + 4)
    assert "'rerank'" in down[0], down
    assert embeds.failures == [] and set(embeds.statuses) == {200}, (embeds.failures, embeds.statuses)
    assert reranks.failures == [] and set(reranks.statuses) == {200}, (reranks.failures, reranks.statuses)
    assert served_meanwhile > 0  # the embedder answered while the reranker's engine restarted
    assert engine_pids(server)["0"] == embedder
    assert "the other models serve on" in server.stderr()
