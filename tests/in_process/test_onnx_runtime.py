"""The bundled model served with --runtime onnxruntime: its vectors equal sentence-transformers' float32 ones, and the
graph is cached where --onnx-cache-dir says, not in the model folder. And with --runtime hybrid (small passes through
that graph, larger ones through torch)."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
from sentence_transformers import SentenceTransformer

from engine_core.int8_linear import products_saturate
from engine_core.onnx_runtime import default_cache_dir, graph_target
from engine_core.runner import ModelRunner, Rows
from engine_core.small_passes import SmallPassRunner
from tests.in_process.stack_server import served
from tests.sentences import SENTENCES

# float32 noise only: the fused graph reorders sums (the start-up probe's bound too).
MIN_COSINE = 0.99999


@pytest.fixture(scope="module")
def onnx_cache(bundled_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A cache of the module's own, that holds the bundled model's graph: copied from the default cache, where the
    suite's controller exported it (tests/conftest.py), rather than exported again."""
    target = graph_target(bundled_model, "BertModel", default_cache_dir())
    cache = tmp_path_factory.mktemp("onnx-cache")
    shutil.copytree(target.parent, cache / target.parent.name, ignore=shutil.ignore_patterns("export*"))
    return cache


def test_bundled_model_through_onnxruntime_equals_sentence_transformers(bundled_model: Path, onnx_cache: Path) -> None:
    reference = SentenceTransformer(str(bundled_model), device="cpu").encode(SENTENCES, convert_to_numpy=True)
    args = ("--device", "cpu", "--dtype", "float32", "--runtime", "onnxruntime", "--onnx-cache-dir", str(onnx_cache))
    with served(*args) as server, server.client() as http:
        # one request of every sentence (batches of mixed lengths, padded) and one sentence alone (the small session)
        response = http.post("/v1/embeddings", json={"input": SENTENCES})
        alone = http.post("/v1/embeddings", json={"input": SENTENCES[3]})
    assert response.status_code == 200, response.text
    got = np.asarray([item["embedding"] for item in response.json()["data"]], dtype=np.float32)
    got_alone = np.asarray(alone.json()["data"][0]["embedding"], dtype=np.float32)
    cosine = (got * reference).sum(axis=1) / np.linalg.norm(got, axis=1) / np.linalg.norm(reference, axis=1)
    assert cosine.min() >= MIN_COSINE, f"lowest cosine {cosine.min()} at sentence {cosine.argmin()}"
    assert float(got_alone @ reference[3] / np.linalg.norm(got_alone) / np.linalg.norm(reference[3])) >= MIN_COSINE
    assert len(list(onnx_cache.glob("*/packed.onnx"))) == 1


@pytest.mark.parametrize("dtype", ["float32", "int8"])
def test_bundled_model_through_hybrid_equals_sentence_transformers(
    bundled_model: Path, onnx_cache: Path, dtype: str
) -> None:
    """--runtime hybrid: a lone sentence (a small pass, through the graph) is float32's vector whatever --dtype says,
    and a batch of every sentence (through torch) is float32's, or int8's within its bound."""
    reference = SentenceTransformer(str(bundled_model), device="cpu").encode(SENTENCES, convert_to_numpy=True)
    args = ("--device", "cpu", "--dtype", dtype, "--runtime", "hybrid", "--onnx-cache-dir", str(onnx_cache))
    with served(*args) as server, server.client() as http:
        runner = server.engine().core.runner
        assert isinstance(runner, SmallPassRunner)
        # which runner each pass took, recorded from outside the engine
        took: list[str] = []
        choose = runner.runner_for

        def recorded(rows: Rows) -> ModelRunner:
            chosen = choose(rows)
            took.append("graph" if chosen is runner.small else "torch")
            return chosen

        runner.runner_for = recorded  # type: ignore[method-assign]
        response = http.post("/v1/embeddings", json={"input": SENTENCES})
        alone = [http.post("/v1/embeddings", json={"input": SENTENCES[i]}) for i in (0, 3)]
    # the 60 sentences' passes (cut by the batch cap) are large, but a last one of the shortest may be small
    assert took[-2:] == ["graph", "graph"] and "torch" in took[:-2], took
    assert response.status_code == 200, response.text
    got = np.asarray([item["embedding"] for item in response.json()["data"]], dtype=np.float32)
    batched = cosines(got, reference)
    if dtype == "float32":
        assert batched.min() >= MIN_COSINE
    else:
        assert (0.99 if products_saturate() else 0.995) <= batched.min() < 0.99999  # int8 indeed
    got_alone = np.asarray([one.json()["data"][0]["embedding"] for one in alone], dtype=np.float32)
    assert cosines(got_alone, reference[[0, 3]]).min() >= MIN_COSINE
    assert len(list(onnx_cache.glob("*/packed.onnx"))) == 1


def cosines(got: np.ndarray, expected: np.ndarray) -> np.ndarray:
    return (got * expected).sum(axis=1) / np.linalg.norm(got, axis=1) / np.linalg.norm(expected, axis=1)
