"""bge-m3 through the API server and the engine (stack_server.py): a request's choice of output (`sparse` on the
wire, per-token for its ColBERT vectors) crosses the ZeroMQ wire, and its lexical weights come back as index and
value frames from a model whose own output is dense (tests/fidelity holds every output and endpoint to BGEM3FlagModel
without the wire)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from tests.fidelity.bge_m3_layouts import bge_m3_reference, build_bge_m3
from tests.in_process.stack_server import InProcessServer, served_folder
from tests.sentences import SENTENCES


@pytest.fixture(scope="module")
def bge_m3(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("bge-m3") / "bge-m3"
    build_bge_m3(folder)
    return folder


@pytest.fixture(scope="module")
def bge_m3_server(bge_m3: Path) -> Iterator[InProcessServer]:
    with served_folder(bge_m3) as started:
        yield started


def test_each_of_bge_m3s_outputs_crosses_the_wire_as_bgem3flagmodel_computes_it(
    bge_m3_server: InProcessServer, bge_m3: Path
) -> None:
    texts = SENTENCES[:12]
    model = bge_m3_reference(bge_m3)
    reference = model.encode(texts, return_dense=True, return_sparse=True, return_colbert_vecs=True)
    with bge_m3_server.client() as client:
        models = client.get("/v1/models").json()["data"][0]
        assert (models["output"], models["outputs"]) == ("vector", ["vector", "sparse", "multi_vector"])
        dense = client.post("/v1/embeddings", json={"input": texts, "truncate_prompt_tokens": -1})
        sparse = client.post("/embed_sparse", json={"inputs": texts, "truncate": True})
        colbert = client.post("/embed_all", json={"inputs": texts, "truncate": True})
        ranked = client.post(
            "/v1/rerank", json={"query": texts[0], "documents": texts[1:], "output": "multi_vector", "top_n": 3}
        )
    for response in (dense, sparse, colbert, ranked):
        assert response.status_code == 200, response.text
    served = np.asarray([item["embedding"] for item in dense.json()["data"]], dtype=np.float32)
    np.testing.assert_allclose(served, reference["dense_vecs"], atol=1e-5)
    for entries, weights in zip(sparse.json(), reference["lexical_weights"], strict=True):
        assert [entry["index"] for entry in entries] == sorted(int(token_id) for token_id in weights)
        expected = [float(weights[str(entry["index"])]) for entry in entries]
        np.testing.assert_allclose([entry["value"] for entry in entries], expected, atol=1e-4, rtol=0)
    for matrix, expected in zip(colbert.json(), reference["colbert_vecs"], strict=True):
        np.testing.assert_allclose(np.asarray(matrix, dtype=np.float32), expected, atol=1e-5)
    scores = [
        float(model.colbert_score(reference["colbert_vecs"][0], vectors)) for vectors in reference["colbert_vecs"][1:]
    ]
    best = np.argsort(scores, kind="stable")[::-1][:3]
    assert [item["index"] for item in ranked.json()["results"]] == best.tolist()
