"""A plugin package from tests/plugins/, installed the way a user would, served end to end with --plugin."""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest

from poolserve.config import BUNDLED_MODEL_NAME
from tests.sentences import SENTENCES
from tests.utils import LaunchedServer

PLUGIN_SOURCE = Path(__file__).parents[1] / "plugins" / "poolserve_example_plugin"
TOKEN_LIMIT = 200
INPUT_LIMIT = 8


@pytest.fixture(scope="module")
def plugin_path(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The example plugin pip-installed into a folder of its own (never into the test's environment)."""
    root = tmp_path_factory.mktemp("plugin")
    source = shutil.copytree(PLUGIN_SOURCE, root / "source")  # the build writes beside the sources
    target = root / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--target", str(target),
         str(source)],
        check=True, capture_output=True, timeout=300,
    )  # fmt: skip
    return str(target)


@pytest.fixture(scope="module")
def served(plugin_path: str) -> Iterator[LaunchedServer]:
    launched = LaunchedServer(
        "--api-server-count", "1", "--plugin", "example", "--max-tokens-per-request", str(TOKEN_LIMIT),
        "--max-inputs-per-request", str(INPUT_LIMIT),
        env={"PYTHONPATH": plugin_path},
    )  # fmt: skip
    try:
        yield launched.wait_ready()
    finally:
        launched.stop()


@pytest.fixture(scope="module")
def http(served: LaunchedServer) -> Iterator[httpx.Client]:
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


def test_an_unknown_plugin_stops_launch_naming_it_and_the_installed_ones(plugin_path: str) -> None:
    launched = LaunchedServer("--plugin", "nope", env={"PYTHONPATH": plugin_path})
    try:
        assert launched.wait_exit(30) != 0
        assert "--plugin has value 'nope', which is not an installed plugin; installed: example." in launched.stderr()
    finally:
        launched.stop()
