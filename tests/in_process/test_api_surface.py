"""The rest of the API on the bundled bi-encoder, in the shapes vLLM's, Jina's, Cohere's and TEI's clients send."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from sentence_transformers import SentenceTransformer
from transformers import AutoTokenizer

from poolserve.config import BUNDLED_MODEL_NAME
from tests.in_process.stack_server import InProcessServer
from tests.sentences import SENTENCES


@pytest.fixture
def http(server: InProcessServer) -> Iterator[httpx.Client]:
    with server.client() as client:
        yield client


@pytest.fixture(scope="module")
def st_model(bundled_model: Path) -> SentenceTransformer:
    return SentenceTransformer(str(bundled_model), device="cpu")


def post(http: httpx.Client, path: str, body: dict[str, Any]) -> Any:
    response = http.post(path, json=body)
    assert response.status_code == 200, response.text
    return response.json()


def test_pooling_gives_the_embedding_or_the_raw_pooled_vector(
    http: httpx.Client, st_model: SentenceTransformer
) -> None:
    body = post(http, "/pooling", {"input": SENTENCES[:3], "model": BUNDLED_MODEL_NAME})
    assert body["object"] == "list" and body["id"].startswith("pool-") and body["model"] == BUNDLED_MODEL_NAME
    assert [d["object"] for d in body["data"]] == ["pooling"] * 3
    vectors = np.asarray([d["data"] for d in body["data"]])
    np.testing.assert_allclose(vectors, st_model.encode(SENTENCES[:3]), atol=1e-5)
    raw = np.asarray([d["data"] for d in post(http, "/pooling", {"input": SENTENCES[:3], "normalize": False})["data"]])
    assert not np.allclose(np.linalg.norm(raw, axis=1), 1.0)
    np.testing.assert_allclose(raw / np.linalg.norm(raw, axis=1, keepdims=True), vectors, atol=1e-5)


def test_a_bi_encoder_scores_by_cosine(http: httpx.Client, st_model: SentenceTransformer) -> None:
    body = post(http, "/score", {"text_1": SENTENCES[14], "text_2": SENTENCES[15:18]})
    vectors = st_model.encode(SENTENCES[14:18])
    np.testing.assert_allclose([d["score"] for d in body["data"]], vectors[1:] @ vectors[0], atol=1e-5)
    pairs = post(http, "/score", {"text_1": SENTENCES[:2], "text_2": SENTENCES[2:4]})
    v = st_model.encode(SENTENCES[:4])
    np.testing.assert_allclose([d["score"] for d in pairs["data"]], [v[0] @ v[2], v[1] @ v[3]], atol=1e-5)


def test_a_bi_encoder_reranks_by_cosine(http: httpx.Client, st_model: SentenceTransformer) -> None:
    query, documents = SENTENCES[14], SENTENCES[15:20]
    vectors = st_model.encode([query, *documents])
    scores = vectors[1:] @ vectors[0]
    body = post(http, "/v2/rerank", {"query": query, "documents": documents, "top_n": 2})
    assert [r["index"] for r in body["results"]] == list(np.argsort(-scores)[:2])
    np.testing.assert_allclose([r["relevance_score"] for r in body["results"]], np.sort(scores)[::-1][:2], atol=1e-5)
    assert body["results"][0]["document"]["text"] == documents[int(np.argmax(scores))]


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/score", {"text_1": ["a", "b"], "text_2": ["c", "d", "e"]}),
        ("/score", {"text_1": [], "text_2": "c"}),
        ("/score", {"text_1": "a", "text_2": ""}),
        ("/rerank", {"query": "q", "documents": []}),
        ("/rerank", {"query": "", "documents": ["a"]}),
        ("/rerank", {"query": "q"}),
        ("/rerank", {"query": "q", "documents": ["a"], "texts": ["a"]}),
        ("/rerank", {"query": "q", "documents": ["a"], "top_n": -1}),
        ("/classify", {"input": "a"}),
        ("/tokenize", {}),
        ("/tokenize", {"prompt": "a", "inputs": "b"}),
        ("/detokenize", {"tokens": [1, 999_999]}),
        ("/v1/embeddings", {"input": [{"image": "data:image/png;base64,AAAA"}]}),
    ],
)
def test_malformed_or_unsupported_requests_get_a_400(http: httpx.Client, path: str, body: dict[str, Any]) -> None:
    response = http.post(path, json=body)
    assert response.status_code == 400, response.text
    assert set(response.json()["error"]) == {"message", "type", "param", "code"}


@pytest.mark.parametrize(
    ("path", "body", "status", "error_type"),
    [
        ("/predict", {"inputs": "a"}, 424, "Backend"),  # TEI: the model is not a classifier
        ("/embed", {"inputs": "a", "prompt_name": "summary"}, 413, "Validation"),  # the model has query, document
        ("/embed", {"inputs": "word " * 300}, 413, "Validation"),
        ("/embed", {"inputs": []}, 400, "Empty"),
        ("/embed_sparse", {"inputs": "a"}, 424, "Backend"),
        ("/", {"inputs": 1.5}, 422, "Validation"),
    ],
)
def test_tei_routes_refuse_as_tei_does(
    http: httpx.Client, path: str, body: dict[str, Any], status: int, error_type: str
) -> None:
    response = http.post(path, json=body)
    assert response.status_code == status, response.text
    assert set(response.json()) == {"error", "error_type"} and response.json()["error_type"] == error_type


def test_embed_all_gives_each_tokens_state_and_they_average_to_the_mean_pooled_vector(http: httpx.Client) -> None:
    texts = SENTENCES[:3]
    states = post(http, "/embed_all", {"inputs": texts})
    pooled = np.asarray(post(http, "/embed", {"inputs": texts, "normalize": False}))
    for text, rows, vector in zip(texts, states, pooled, strict=True):
        assert len(rows) == len(post(http, "/tokenize", {"inputs": text})[0])
        np.testing.assert_allclose(np.mean(rows, axis=0), vector, atol=1e-5)
    tokens = post(http, "/pooling", {"input": texts[:1], "task": "token_embed"})["data"][0]["data"]
    unit = np.asarray(states[0]) / np.linalg.norm(states[0], axis=1, keepdims=True)
    np.testing.assert_allclose(tokens, unit, atol=1e-5)  # vLLM's token_embed: each token's state, normalized


def test_post_root_and_invocations_embed_and_similarity_decode_as_tei(
    http: httpx.Client, st_model: SentenceTransformer
) -> None:
    body = {"inputs": SENTENCES[:2]}
    embedded = post(http, "/embed", body)
    np.testing.assert_allclose(post(http, "/", body), embedded, atol=1e-6)
    np.testing.assert_allclose(post(http, "/invocations", body), embedded, atol=1e-6)
    assert http.get("/").status_code == 200
    similarity = post(http, "/similarity", {"inputs": {"source_sentence": SENTENCES[0], "sentences": SENTENCES[1:4]}})
    vectors = st_model.encode(SENTENCES[:4])
    np.testing.assert_allclose(similarity, vectors[1:] @ vectors[0], atol=1e-5)
    ids = post(http, "/tokenize", {"inputs": "Hello world"})[0]
    assert post(http, "/decode", {"ids": [t["id"] for t in ids]}) == ["hello world"]


def test_huggingface_hubs_inference_client_with_the_bare_url(
    server: InProcessServer, st_model: SentenceTransformer, monkeypatch: pytest.MonkeyPatch
) -> None:
    import huggingface_hub.constants
    from huggingface_hub import InferenceClient

    # huggingface_hub refuses every request while HF_HUB_OFFLINE is set, even to a local server.
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    client = InferenceClient(model=server.url)
    vectors = client.feature_extraction(SENTENCES[0])
    np.testing.assert_allclose(np.asarray(vectors).reshape(-1), st_model.encode(SENTENCES[0]), atol=1e-5)
    scores = client.sentence_similarity(SENTENCES[0], other_sentences=SENTENCES[1:3])
    expected = st_model.encode(SENTENCES[1:3]) @ st_model.encode(SENTENCES[0])
    np.testing.assert_allclose(scores, expected, atol=1e-5)


def test_tokenize_and_detokenize_as_vllm(http: httpx.Client, bundled_model: Path) -> None:
    hf = AutoTokenizer.from_pretrained(bundled_model)
    text = SENTENCES[18]
    body = post(http, "/tokenize", {"prompt": text, "return_token_strs": True})
    assert body["tokens"] == hf(text)["input_ids"]
    assert body["count"] == len(body["tokens"]) and body["max_model_len"] == 256
    assert body["token_strs"] == hf.convert_ids_to_tokens(body["tokens"])
    bare = post(http, "/tokenize", {"prompt": text, "add_special_tokens": False})
    assert bare["tokens"] == body["tokens"][1:-1] and bare["token_strs"] is None
    assert post(http, "/detokenize", {"tokens": bare["tokens"]})["prompt"] == hf.decode(bare["tokens"])


def test_tokenize_as_tei(http: httpx.Client) -> None:
    body = post(http, "/tokenize", {"inputs": ["Hello world", "Café"]})
    assert len(body) == 2
    hello = body[0]
    assert hello[0] == {"id": 101, "text": "[CLS]", "special": True, "start": None, "stop": None}
    assert hello[1] == {"id": 7592, "text": "Hello", "special": False, "start": 0, "stop": 5}
    assert hello[-1]["special"] and hello[-1]["text"] == "[SEP]"


def test_tei_embed_matches_sentence_transformers(http: httpx.Client, st_model: SentenceTransformer) -> None:
    body = post(http, "/embed", {"inputs": SENTENCES[:4]})
    np.testing.assert_allclose(np.asarray(body), st_model.encode(SENTENCES[:4]), atol=1e-5)
    single = post(http, "/embed", {"inputs": SENTENCES[0]})
    np.testing.assert_allclose(single, st_model.encode(SENTENCES[:1]), atol=1e-5)
    raw = np.asarray(post(http, "/embed", {"inputs": SENTENCES[:2], "normalize": False}))
    assert not np.allclose(np.linalg.norm(raw, axis=1), 1.0)
    short = np.asarray(post(http, "/embed", {"inputs": SENTENCES[:2], "dimensions": 8}))
    assert short.shape == (2, 8)


def test_tei_embed_truncates_on_either_side_when_asked(http: httpx.Client, st_model: SentenceTransformer) -> None:
    long_text = " ".join(SENTENCES)
    right = np.asarray(post(http, "/embed", {"inputs": long_text, "truncate": True}))
    np.testing.assert_allclose(right, st_model.encode([long_text]), atol=1e-5)
    left = np.asarray(post(http, "/embed", {"inputs": long_text, "truncate": True, "truncation_direction": "Left"}))
    assert float(left[0] @ right[0]) < 0.99


def test_tei_info_and_version(http: httpx.Client) -> None:
    info = http.get("/info").json()
    assert info["model_id"] == info["served_model_name"] == BUNDLED_MODEL_NAME
    assert info["model_type"] == {"embedding": {"pooling": "mean"}}
    assert info["max_input_length"] == 256 and info["model_dtype"] == "float32"
    assert info["max_batch_tokens"] == 8192 and info["max_client_batch_size"] == 2048
    assert info["version"] == http.get("/version").json()["version"]


def test_openapi_describes_every_endpoint_from_the_request_types(http: httpx.Client) -> None:
    document = http.get("/openapi.json").json()
    assert document["openapi"].startswith("3.1")
    expected = {
        ("/v1/embeddings", "post"), ("/v1/models", "get"), ("/pooling", "post"), ("/score", "post"),
        ("/v1/score", "post"),
        ("/rerank", "post"), ("/v1/rerank", "post"), ("/v2/rerank", "post"), ("/classify", "post"),
        ("/tokenize", "post"), ("/detokenize", "post"), ("/embed", "post"), ("/predict", "post"),
        ("/info", "get"), ("/version", "get"), ("/health", "get"), ("/health/ready", "get"), ("/health/live", "get"),
        ("/ping", "get"), ("/openapi.json", "get"), ("/embeddings", "post"), ("/embed_all", "post"),
        ("/embed_sparse", "post"), ("/similarity", "post"), ("/decode", "post"), ("/", "get"), ("/", "post"),
        ("/invocations", "post"),
    }  # fmt: skip
    described = {(path, method) for path, methods in document["paths"].items() for method in methods}
    assert described == expected
    schemas = document["components"]["schemas"]
    embeddings = document["paths"]["/v1/embeddings"]["post"]
    ref = embeddings["requestBody"]["content"]["application/json"]["schema"]["$ref"]
    request_schema = schemas[ref.rsplit("/", 1)[1]]
    assert set(request_schema["properties"]) >= {"input", "model", "encoding_format", "dimensions", "messages"}
    assert request_schema["properties"]["dimensions"]["anyOf"][0]["minimum"] == 1
    assert {"ErrorBody", "TeiErrorBody"} <= set(schemas)
    for path, methods in document["paths"].items():
        for operation in methods.values():
            assert operation["responses"], path


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/v1/embeddings", {"input": ["a"] * 2049}, "input"),
        ("/pooling", {"input": ["a"] * 2049}, "input"),
        ("/embed", {"inputs": ["a"] * 2049}, "inputs"),
        ("/tokenize", {"inputs": ["a"] * 2049}, "inputs"),
        ("/score", {"text_1": "q", "text_2": ["a"] * 2049}, "text_2"),
        ("/rerank", {"query": "q", "documents": ["a"] * 2049}, "documents"),
        ("/rerank", {"query": "q", "texts": ["a"] * 2049}, "texts"),
    ],
)
def test_too_many_inputs_is_one_message_on_every_endpoint(
    http: httpx.Client, path: str, body: dict[str, Any], param: str
) -> None:
    response = http.post(path, json=body)
    message = (
        f"`{param}` has 2049 inputs, more than this server's limit of 2048 per request (--max-inputs-per-request)."
    )
    if param in ("inputs", "texts"):  # a TEI body: TEI's status and shape
        assert response.status_code == 413, response.text
        assert response.json() == {"error": message, "error_type": "Validation"}
        return
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["code"] == "too_many_inputs" and error["param"] == param
    assert error["message"] == message


def test_parse_and_render_times_come_back_apart(http: httpx.Client) -> None:
    response = http.post("/v1/embeddings", json={"input": SENTENCES[:4]})
    assert response.status_code == 200
    assert float(response.headers["x-tokenization-time"]) >= 0
    assert float(response.headers["x-encoding-time"]) >= 0
    assert float(response.headers["x-total-time"]) >= float(response.headers["x-encoding-time"])
