"""A ColBERT (sentence-transformers' MultiVectorEncoder) served for real: its token vectors and MaxSim scores cross
the ZeroMQ wire from the engine to the API server (stack_server.py) as the fidelity suite (tests/fidelity, no wire)
sees them, equal to the reference."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest

from tests.fidelity.layouts import build_colbert
from tests.in_process.stack_server import served_folder

QUERY = "where are the servers?"
DOCUMENTS = ["servers run in racks, right?", "a cat sat on a mat.", "Embeddings live in vector stores!"]


@pytest.fixture(scope="module")
def colbert_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("colbert") / "model"
    build_colbert(folder)
    return folder


@pytest.fixture(scope="module")
def colbert(colbert_model: Path) -> Iterator[httpx.Client]:
    with served_folder(colbert_model) as server, server.client() as client:
        yield client


def test_queries_and_documents_cross_the_wire_as_their_token_vectors(
    colbert: httpx.Client, colbert_model: Path
) -> None:
    """One request holds both roles (a rerank's query and documents): each input's vectors come back in its
    own place of the reply's one frame, a query's expanded and a document's without its punctuation."""
    from sentence_transformers import MultiVectorEncoder

    model = MultiVectorEncoder(str(colbert_model), device="cpu")
    queries = model.encode_query([QUERY])
    documents = model.encode_document(DOCUMENTS)
    expected = model.similarity(queries, documents)[0].numpy()
    ranked = colbert.post("/v1/rerank", json={"query": QUERY, "documents": DOCUMENTS})
    assert ranked.status_code == 200, ranked.text
    results = ranked.json()["results"]
    assert [item["index"] for item in results] == np.argsort(-expected, kind="stable").tolist()
    scores = {item["index"]: item["relevance_score"] for item in results}
    np.testing.assert_allclose([scores[i] for i in range(len(DOCUMENTS))], expected, atol=1e-4, rtol=1e-5)
    for role, reference in (("query", queries), ("document", documents)):
        texts = [QUERY] if role == "query" else DOCUMENTS
        answer = colbert.post("/pooling", json={"input": texts, "input_type": role, "encoding_format": "float"})
        assert answer.status_code == 200, answer.text
        for item, vectors in zip(answer.json()["data"], reference, strict=True):
            np.testing.assert_allclose(np.asarray(item["data"], dtype=np.float32), vectors.numpy(), atol=1e-5)
    info = colbert.get("/v1/models").json()["data"][0]
    assert info["output"] == "multi_vector"
