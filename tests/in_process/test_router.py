"""A Router model through the API server and the engine (stack_server.py): each text's route (`queries` first) and
where its pooling starts after a prompt the Pooling leaves out (`pool_from`) cross the ZeroMQ wire, and the vectors
come back as sentence-transformers computes them (tests/fidelity holds every layout without the wire)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from tests.fidelity.compare import DOCUMENTS, QUERY, TEXTS, assert_same
from tests.fidelity.layouts import build_router_shared_transformer
from tests.in_process.stack_server import InProcessServer, served_folder


@pytest.fixture(scope="module")
def router_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("router") / "model"
    build_router_shared_transformer(folder)  # two routes over one encoder, include_prompt false, default "query"
    return folder


@pytest.fixture(scope="module")
def router_server(router_model: Path) -> Iterator[InProcessServer]:
    with served_folder(router_model) as started:
        yield started


def test_each_role_takes_its_route_across_the_wire(router_server: InProcessServer, router_model: Path) -> None:
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(router_model), device="cpu")
    with router_server.client() as client:
        for body, expected in (
            ({}, model.encode(TEXTS)),
            ({"input_type": "query"}, model.encode_query(TEXTS)),
            ({"input_type": "document"}, model.encode_document(TEXTS)),
        ):
            response = client.post("/pooling", json={"input": TEXTS, "normalize": False, **body})
            assert response.status_code == 200, response.text
            served = np.asarray([item["data"] for item in response.json()["data"]], dtype=np.float32)
            assert_same(served, np.asarray(expected))
        ranked = client.post("/v1/rerank", json={"query": QUERY, "documents": DOCUMENTS})
        assert ranked.status_code == 200, ranked.text
    scores = {item["index"]: item["relevance_score"] for item in ranked.json()["results"]}
    expected = model.similarity(model.encode_query([QUERY]), model.encode_document(DOCUMENTS))[0].numpy()
    np.testing.assert_allclose([scores[i] for i in range(len(DOCUMENTS))], expected, atol=1e-5, rtol=1e-4)
