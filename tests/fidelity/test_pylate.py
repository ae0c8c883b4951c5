"""A ColBERT saved by PyLate itself, served, against PyLate's own `encode` and `colbert_scores` (the issue's
reference for late interaction), where PyLate's interpreter is at hand: `make test-pylate` builds it
(PYLATE_VENV, PyLate 1.6 with sentence-transformers 5.3, which poolserve's environment cannot hold) and runs this
with POOLSERVE_PYLATE_PYTHON set. Without it, this module is skipped: `make test` holds PyLate's layout to
sentence-transformers 6's reading of it (test_served.py, `pylate`, `pylate-stanford-markers`).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest

from tests.fidelity.layouts import tiny_bert
from tests.fidelity.stack import load, serve_in_process

PYLATE_PYTHON = os.environ.get("POOLSERVE_PYLATE_PYTHON", "")
SCRIPT = Path(__file__).with_name("pylate_reference.py")
TEXTS = [
    "Hello world!",
    "A MUCH longer sentence, about Servers and EMBEDDINGS.",
    "x",
    "déjà vu",
    "where are the servers?",
]
QUERY = "where are the servers?"
DOCUMENTS = ["servers run in racks, right?", "a cat sat on a mat.", "Embeddings live in vector stores!"]

pytestmark = pytest.mark.skipif(not PYLATE_PYTHON, reason="POOLSERVE_PYLATE_PYTHON is not set (make test-pylate)")


def test_a_colbert_saved_by_pylate_is_served_as_pylate_computes_it(tmp_path: Path) -> None:
    base, folder, reference = tmp_path / "base", tmp_path / "pylate", tmp_path / "reference.npz"
    tiny_bert(base, 21)
    texts = tmp_path / "texts.json"
    texts.write_text(json.dumps({"texts": TEXTS, "query": QUERY, "documents": DOCUMENTS}))
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    subprocess.run(
        [PYLATE_PYTHON, str(SCRIPT), str(base), str(folder), str(reference), str(texts)], check=True, env=env
    )
    expected = np.load(reference)
    with serve_in_process(load(folder)) as client:
        for role in ("query", "document"):
            answer = client.post("/pooling", json={"input": TEXTS, "input_type": role, "truncate_prompt_tokens": -1})
            assert answer.status_code == 200, answer.text
            for i, item in enumerate(answer.json()["data"]):
                served, wanted = np.asarray(item["data"], dtype=np.float32), expected[f"{role}_{i}"]
                assert served.shape == wanted.shape, (role, i)
                cosine = (
                    np.einsum("ij,ij->i", served, wanted)
                    / np.linalg.norm(served, axis=1)
                    / np.linalg.norm(wanted, axis=1)
                )
                assert cosine.min() >= 0.9999, (role, i, cosine)
        ranked = client.post("/v1/rerank", json={"query": QUERY, "documents": DOCUMENTS})
        assert ranked.status_code == 200, ranked.text
    results = ranked.json()["results"]
    assert [item["index"] for item in results] == np.argsort(-expected["scores"], kind="stable").tolist()
    scores = {item["index"]: item["relevance_score"] for item in results}
    np.testing.assert_allclose([scores[i] for i in range(len(DOCUMENTS))], expected["scores"], atol=1e-4, rtol=1e-5)
