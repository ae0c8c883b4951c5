"""The clients people already have, in their plain documented usage with a bare base URL, against a live
server: cohere (v1 and v2 rerank) and langchain-openai (embeddings). The openai client has its own tests
(test_embeddings.py), huggingface_hub's InferenceClient its own (test_api_surface.py). llama-index's
OpenAILikeEmbedding sends its requests through the openai client and passed against a live server when
checked by hand (docs/api.md, "Compatibility"); it stays out of the dev extras, whose install time the
suite's limit counts."""

from __future__ import annotations

import json
import math
from pathlib import Path

import cohere
import httpx
import jsonschema_rs
import numpy as np

from poolserve.config import BUNDLED_MODEL_NAME
from tests.in_process.stack_server import InProcessServer

QUERY = "What is the capital of France?"
DOCUMENTS = [
    "Paris is the capital and most populous city of France.",
    "The quick brown fox jumps over the lazy dog.",
    "Berlin is the capital of Germany.",
]
TEXTS = ["Vector databases store embeddings.", "Retrieval grounds answers in documents.", "hello"]


def embeddings_over_http(server: InProcessServer, texts: list[str]) -> np.ndarray:
    with server.client() as client:
        data = client.post("/v1/embeddings", json={"input": texts}).json()["data"]
    return np.asarray([item["embedding"] for item in data])


def served_model(server: InProcessServer) -> str:
    with server.client() as client:
        return str(client.get("/v1/models").json()["data"][0]["id"])


def scores_over_http(server: InProcessServer) -> dict[int, float]:
    with server.client() as client:
        body = client.post("/rerank", json={"query": QUERY, "documents": DOCUMENTS}).json()
    return {item["index"]: item["relevance_score"] for item in body["results"]}


def test_cohere_v2_rerank_with_a_bare_base_url(cross_encoder_server: InProcessServer) -> None:
    # The client's own httpx client is never closed by it; one the test owns is.
    with httpx.Client() as http:
        client = cohere.ClientV2(api_key="unused", base_url=cross_encoder_server.url, httpx_client=http)
        response = client.rerank(model=served_model(cross_encoder_server), query=QUERY, documents=DOCUMENTS, top_n=2)
    expected = scores_over_http(cross_encoder_server)
    assert [r.index for r in response.results] == sorted(expected, key=expected.__getitem__, reverse=True)[:2]
    for result in response.results:
        assert math.isclose(result.relevance_score, expected[result.index], rel_tol=1e-5)


def test_cohere_v1_rerank_with_a_bare_base_url(cross_encoder_server: InProcessServer) -> None:
    with httpx.Client() as http:
        client = cohere.Client(api_key="unused", base_url=cross_encoder_server.url, httpx_client=http)
        response = client.rerank(model=served_model(cross_encoder_server), query=QUERY, documents=DOCUMENTS)
    expected = scores_over_http(cross_encoder_server)
    assert {r.index for r in response.results} == set(expected)
    for result in response.results:
        assert math.isclose(result.relevance_score, expected[result.index], rel_tol=1e-5)


def test_langchain_openai_embeddings(server: InProcessServer) -> None:
    from langchain_openai import OpenAIEmbeddings

    # check_embedding_ctx_length=False: langchain's documented setting for servers other than OpenAI's
    # (with it on, it tokenizes with OpenAI's tiktoken vocabulary and sends those ids).
    embeddings = OpenAIEmbeddings(
        model=BUNDLED_MODEL_NAME, base_url=f"{server.url}/v1", api_key="unused", check_embedding_ctx_length=False
    )
    expected = embeddings_over_http(server, TEXTS)
    np.testing.assert_allclose(embeddings.embed_documents(TEXTS), expected, atol=1e-6)
    np.testing.assert_allclose(embeddings.embed_query(TEXTS[0]), expected[0], atol=1e-6)


def test_embeddings_and_their_errors_match_openais_schema(server: InProcessServer) -> None:
    """Responses and error bodies against OpenAI's own types (tests/data/openai-schemas.json says where
    they come from), whatever a client does with extra leniency."""
    schemas = json.loads((Path(__file__).parent.parent / "data" / "openai-schemas.json").read_text())
    response_schema = jsonschema_rs.validator_for(schemas["CreateEmbeddingResponse"])
    error_schema = jsonschema_rs.validator_for(schemas["Error"])
    with server.client() as client:
        for body in ({"input": TEXTS}, {"input": TEXTS[0], "dimensions": 8}, {"input": [[101, 7592, 102]]}):
            answer = client.post("/v1/embeddings", json=body)
            assert answer.status_code == 200
            response_schema.validate(answer.json())
        for body in ({"input": []}, {"input": "x", "dimensions": 0}, {"input": "x", "model": "nope"}, {"inpt": "x"}):
            answer = client.post("/v1/embeddings", json=body)
            assert 400 <= answer.status_code < 500
            error_schema.validate(answer.json()["error"])
