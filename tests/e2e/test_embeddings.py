"""POST /v1/embeddings on real `launch` processes: what one process cannot show (several API servers answer; the
server on CUDA). Everything else of the endpoint: tests/in_process/test_embeddings.py."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np
import pytest
import torch
from sentence_transformers import SentenceTransformer

from bench.harness.server_process import PoolserveProcess
from tests.sentences import SENTENCES


def test_concurrent_requests_are_answered_by_more_than_one_api_server(server: PoolserveProcess) -> None:
    def one(i: int) -> str:
        # A new connection per request, so the kernel hands each one to whichever process accepts first.
        with httpx.Client(base_url=server.url, timeout=30) as client:
            response = client.post("/v1/embeddings", json={"input": SENTENCES[i % len(SENTENCES)]})
            assert response.status_code == 200
            return response.headers["x-poolserve-server"]

    seen: set[str] = set()
    with ThreadPoolExecutor(32) as pool:
        for _ in range(5):
            seen.update(pool.map(one, range(64)))
            if len(seen) > 1:
                break
    assert seen == {"0", "1"}


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_the_server_on_cuda_equals_sentence_transformers(bundled_model: Path) -> None:
    """`--device cuda` (float16 by default) served end to end, against Sentence-Transformers on the CPU."""
    reference = SentenceTransformer(str(bundled_model), device="cpu").encode(SENTENCES, convert_to_numpy=True)
    launched = PoolserveProcess("--device", "cuda", "--api-server-count", "2")
    try:
        with launched.wait_ready().client() as client:
            response = client.post("/v1/embeddings", json={"input": SENTENCES})
            assert response.status_code == 200, response.text
            got = np.asarray([item["embedding"] for item in response.json()["data"]], dtype=np.float32)
    finally:
        launched.stop()
    cosine = (got * reference).sum(axis=1) / np.linalg.norm(got, axis=1) / np.linalg.norm(reference, axis=1)
    assert cosine.min() >= 0.999, f"lowest cosine {cosine.min()} at sentence {cosine.argmin()}"
