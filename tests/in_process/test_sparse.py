"""A SPLADE model through the API server and the engine (stack_server.py): its sparse rows cross the ZeroMQ wire as
index and value frames and come back as SparseEncoder.encode computes them (tests/fidelity holds every layout without
the wire)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import numpy as np

from tests.in_process.stack_server import InProcessServer
from tests.sentences import SENTENCES


def test_sparse_vectors_cross_the_wire_as_sparse_encoder_computes_them(
    splade_server: InProcessServer, splade_model: Path
) -> None:
    from sentence_transformers import SparseEncoder

    texts = SENTENCES[:24]
    reference = SparseEncoder(str(splade_model), device="cpu").encode(texts).to_dense().numpy()
    with splade_server.client() as client:
        response = client.post("/embed_sparse", json={"inputs": texts, "truncate": True})
    assert response.status_code == 200, response.text
    served: list[list[dict[str, Any]]] = response.json()
    for entries, row in zip(served, reference, strict=True):
        indices = [entry["index"] for entry in entries]
        np.testing.assert_array_equal(indices, np.flatnonzero(row))
        np.testing.assert_allclose([entry["value"] for entry in entries], row[indices], atol=1e-4, rtol=0)


def test_a_sparse_model_says_so_and_refuses_a_dense_embedding(splade_server: InProcessServer) -> None:
    with splade_server.client() as client:
        check_says_sparse(client)


def check_says_sparse(client: httpx.Client) -> None:
    (model,) = client.get("/v1/models").json()["data"]
    assert model["kind"] == "sparse" and "embed_sparse" in model["tasks"] and "embed" not in model["tasks"]
    assert model["output"] == "sparse"
    assert client.get("/info").json()["model_type"] == {"embedding": {"pooling": "splade"}}
    refused = client.post("/v1/embeddings", json={"input": "hello"})
    assert refused.status_code == 400 and refused.json()["error"]["code"] == "task_not_supported"
    assert client.post("/embed", json={"inputs": "hello"}).status_code == 424
