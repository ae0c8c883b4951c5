"""The bundled model served with --runtime onnxruntime: its vectors equal sentence-transformers' float32 ones, and the
graph is cached where --onnx-cache-dir says, not in the model folder."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from sentence_transformers import SentenceTransformer

from tests.in_process.stack_server import served
from tests.sentences import SENTENCES

# float32 noise only: the fused graph reorders sums (the start-up probe's bound too).
MIN_COSINE = 0.99999


def test_bundled_model_through_onnxruntime_equals_sentence_transformers(bundled_model: Path, tmp_path: Path) -> None:
    reference = SentenceTransformer(str(bundled_model), device="cpu").encode(SENTENCES, convert_to_numpy=True)
    args = ("--device", "cpu", "--dtype", "float32", "--runtime", "onnxruntime", "--onnx-cache-dir", str(tmp_path))
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
    assert len(list(tmp_path.glob("*/model.onnx"))) == 1
