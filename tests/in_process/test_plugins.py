"""A plugin package from tests/plugins/, installed the way a user would, served with --plugin by the API server and
engine of `launch` (stack_server.py). `launch` refusing an unknown plugin: tests/supervisor/test_cli.py."""

from __future__ import annotations

import sys
from collections.abc import Iterator

import httpx
import numpy as np
import pytest

from poolserve.config import BUNDLED_MODEL_NAME
from tests.in_process.stack_server import InProcessServer
from tests.in_process.stack_server import served as serve
from tests.sentences import SENTENCES

TOKEN_LIMIT = 200
INPUT_LIMIT = 8


@pytest.fixture(scope="module")
def served(plugin_path: str) -> Iterator[InProcessServer]:
    # Found where `launch` finds it (PYTHONPATH there): an entry point of a distribution on the import path.
    sys.path.insert(0, plugin_path)
    try:
        with serve(
            "--plugin", "example", "--max-tokens-per-request", str(TOKEN_LIMIT),
            "--max-inputs-per-request", str(INPUT_LIMIT),
        ) as started:  # fmt: skip
            yield started
    finally:
        sys.path.remove(plugin_path)


@pytest.fixture(scope="module")
def http(served: InProcessServer) -> Iterator[httpx.Client]:
    with served.client() as client:
        yield client


def test_the_plugin_endpoint_answers_from_the_real_engine(http: httpx.Client) -> None:
    query, candidates = SENTENCES[0], SENTENCES[1:5]
    response = http.post("/example/nearest", json={"query": query, "candidates": candidates})
    assert response.status_code == 200, response.text
    body = response.json()
    vectors = [
        item["embedding"] for item in http.post("/v1/embeddings", json={"input": [query, *candidates]}).json()["data"]
    ]
    expected = np.asarray(vectors[1:]) @ np.asarray(vectors[0])
    np.testing.assert_allclose(body["scores"], expected, atol=1e-5)
    assert body["index"] == int(np.argmax(expected))
    for header in ("x-tokenization-time", "x-encoding-time", "x-inference-time", "x-compute-tokens"):
        assert header in response.headers


def test_the_plugin_meets_the_same_limits_and_error_shape(http: httpx.Client) -> None:
    inputs = http.post("/example/nearest", json={"query": "q", "candidates": ["c"] * (INPUT_LIMIT + 1)})
    assert inputs.status_code == 400 and inputs.json()["error"]["code"] == "too_many_inputs"
    tokens = http.post("/example/nearest", json={"query": "q", "candidates": ["word " * 150, "word " * 150]})
    assert tokens.status_code == 400, tokens.text
    assert tokens.json()["error"]["code"] == "too_many_tokens"
    assert f"limit of {TOKEN_LIMIT} per request (--max-tokens-per-request)" in tokens.json()["error"]["message"]
    malformed = http.post("/example/nearest", json={"query": 3})
    assert malformed.status_code == 400 and malformed.json()["error"]["param"] == "query"


def test_the_plugin_is_in_openapi_and_metrics(http: httpx.Client) -> None:
    assert http.post("/example/nearest", json={"query": "a", "candidates": ["b"]}).status_code == 200
    operation = http.get("/openapi.json").json()["paths"]["/example/nearest"]["post"]
    assert operation["tags"] == ["plugin example"]
    assert operation["requestBody"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/NearestRequest"
    }
    assert "200" in operation["responses"]
    metrics = http.get("/metrics").text
    labels = f'endpoint="/example/nearest",model="{BUNDLED_MODEL_NAME}"'  # the model that answered it
    assert f'poolserve_requests_total{{{labels},status="200"}}' in metrics
    assert f"poolserve_prompt_tokens_total{{{labels}}}" in metrics
    assert f"poolserve_encode_duration_seconds_count{{{labels}}}" in metrics
