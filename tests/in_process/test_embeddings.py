"""POST /v1/embeddings on the API server and engine of `launch` (stack_server.py): equal to Sentence-Transformers,
OpenAI-compatible, strict. Several API servers, and CUDA, in tests/e2e/test_embeddings.py."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import numpy.typing as npt
import openai
import pytest
from sentence_transformers import SentenceTransformer
from transformers import AutoTokenizer

from poolserve.config import BUNDLED_MODEL_NAME
from tests.in_process.stack_server import InProcessServer
from tests.sentences import SENTENCES

MIN_COSINE = 0.9999


@pytest.fixture(scope="module")
def reference(bundled_model: Path) -> npt.NDArray[np.float32]:
    """Sentence-Transformers' own encoding of the test sentences."""
    model = SentenceTransformer(str(bundled_model), device="cpu")
    return model.encode(SENTENCES, batch_size=16, convert_to_numpy=True)


@pytest.fixture(scope="module")
def token_ids(bundled_model: Path) -> list[list[int]]:
    return AutoTokenizer.from_pretrained(bundled_model)(SENTENCES)["input_ids"]  # type: ignore[no-any-return]


@pytest.fixture
def http(server: InProcessServer) -> Iterator[httpx.Client]:
    with server.client() as client:
        yield client


def embed(http: httpx.Client, **body: Any) -> npt.NDArray[np.float32]:
    response = http.post("/v1/embeddings", json=body)
    assert response.status_code == 200, response.text
    data = response.json()["data"]
    assert [item["index"] for item in data] == list(range(len(data)))
    return np.asarray([item["embedding"] for item in data], dtype=np.float32)


def assert_same_embeddings(got: npt.NDArray[np.float32], want: npt.NDArray[np.float32]) -> None:
    assert got.shape == want.shape
    cosine = (got * want).sum(axis=1) / np.linalg.norm(got, axis=1) / np.linalg.norm(want, axis=1)
    assert cosine.min() >= MIN_COSINE, f"lowest cosine {cosine.min()} at sentence {cosine.argmin()}"


def test_one_request_with_every_sentence_equals_sentence_transformers(http: httpx.Client, reference: Any) -> None:
    assert len(SENTENCES) >= 50
    assert_same_embeddings(embed(http, input=SENTENCES), reference)


def test_one_sentence_per_request_equals_sentence_transformers(http: httpx.Client, reference: Any) -> None:
    got = np.concatenate([embed(http, input=sentence) for sentence in SENTENCES])
    assert_same_embeddings(got, reference)


def test_concurrent_requests_batched_together_equal_sentence_transformers(
    server: InProcessServer, reference: Any
) -> None:
    def one(sentence: str) -> npt.NDArray[np.float32]:
        with server.client() as client:
            return embed(client, input=[sentence])

    with ThreadPoolExecutor(16) as pool:
        got = np.concatenate(list(pool.map(one, SENTENCES)))
    assert_same_embeddings(got, reference)


def test_token_id_inputs_equal_sentence_transformers(
    http: httpx.Client, reference: Any, token_ids: list[list[int]]
) -> None:
    assert_same_embeddings(embed(http, input=token_ids), reference)
    assert_same_embeddings(embed(http, input=token_ids[3]), reference[3:4])


def test_response_shape_and_usage(http: httpx.Client, token_ids: list[list[int]]) -> None:
    response = http.post("/v1/embeddings", json={"input": SENTENCES[:3], "model": BUNDLED_MODEL_NAME})
    body = response.json()
    assert response.headers["content-type"] == "application/json"
    assert body["object"] == "list"
    assert body["model"] == BUNDLED_MODEL_NAME
    assert [item["object"] for item in body["data"]] == ["embedding"] * 3
    tokens = sum(len(ids) for ids in token_ids[:3])
    assert body["usage"] == {"prompt_tokens": tokens, "total_tokens": tokens}


def test_embeddings_are_unit_vectors_and_dimensions_truncates_then_renormalizes(http: httpx.Client) -> None:
    full = embed(http, input=SENTENCES[:4])
    np.testing.assert_allclose(np.linalg.norm(full, axis=1), 1.0, rtol=1e-5)
    short = embed(http, input=SENTENCES[:4], dimensions=64)
    assert short.shape == (4, 64)
    head = full[:, :64] / np.linalg.norm(full[:, :64], axis=1, keepdims=True)
    np.testing.assert_allclose(short, head, atol=1e-5)


def test_truncate_prompt_tokens_matches_sentence_transformers_truncation(
    http: httpx.Client, bundled_model: Path
) -> None:
    long_text = " ".join(SENTENCES)
    model = SentenceTransformer(str(bundled_model), device="cpu")  # truncates at its max_seq_length, 256
    assert_same_embeddings(embed(http, input=long_text, truncate_prompt_tokens=-1), model.encode([long_text]))
    assert http.post("/v1/embeddings", json={"input": long_text}).status_code == 400


def test_openai_client_float_and_base64(server: InProcessServer, reference: Any) -> None:
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused")
    # The client asks for base64 by default and decodes it itself.
    default = client.embeddings.create(model=BUNDLED_MODEL_NAME, input=SENTENCES[:8])
    assert_same_embeddings(np.asarray([d.embedding for d in default.data], dtype=np.float32), reference[:8])
    floats = client.embeddings.create(model=BUNDLED_MODEL_NAME, input=SENTENCES[:8], encoding_format="float")
    assert_same_embeddings(np.asarray([d.embedding for d in floats.data], dtype=np.float32), reference[:8])
    raw = client.embeddings.create(model=BUNDLED_MODEL_NAME, input=SENTENCES[:8], encoding_format="base64")
    decoded = np.stack([np.frombuffer(base64.b64decode(d.embedding), dtype="<f4") for d in raw.data])  # type: ignore[arg-type]
    assert_same_embeddings(decoded, reference[:8])
    assert raw.usage.prompt_tokens > 0
    small = client.embeddings.create(model=BUNDLED_MODEL_NAME, input="hello", dimensions=32)
    assert len(small.data[0].embedding) == 32
    models = client.models.list()
    assert [m.id for m in models.data] == [BUNDLED_MODEL_NAME]
    with pytest.raises(openai.NotFoundError):
        client.embeddings.create(model="no-such-model", input="hello")
    with pytest.raises(openai.BadRequestError):
        client.embeddings.create(model=BUNDLED_MODEL_NAME, input=[])


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({}, "input"),
        ({"input": []}, "input"),
        ({"input": ""}, "input[0]"),
        ({"input": ["ok", 3]}, "input[1]"),
        ({"input": "ok", "dimensions": 0}, "dimensions"),
        ({"input": "ok", "dimensions": 10_000}, "dimensions"),
        ({"input": "ok", "encoding_format": "int8"}, "encoding_format"),
        ({"input": [[1, 99_999]]}, "input[0]"),
        ({"input": "word " * 300}, "input[0]"),
        ({"input": "ok", "truncate_prompt_tokens": 100_000}, "truncate_prompt_tokens"),
    ],
)
def test_bad_input_gets_an_openai_style_400_and_the_server_keeps_serving(
    http: httpx.Client, body: dict[str, Any], param: str
) -> None:
    response = http.post("/v1/embeddings", json=body)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert set(error) == {"message", "type", "param", "code"}
    assert param in error["message"] or error["param"] == param
    assert http.post("/v1/embeddings", json={"input": "still serving"}).status_code == 200


@pytest.mark.parametrize("raw", [b"", b"{", b"[1, 2", b"\xff\xfe\x00", b'"just a string"'])
def test_malformed_json_gets_a_400(http: httpx.Client, raw: bytes) -> None:
    response = http.post("/v1/embeddings", content=raw, headers={"content-type": "application/json"})
    assert response.status_code == 400
    assert response.json()["error"]["type"] == "invalid_request_error"


def test_unknown_model_gets_a_404(http: httpx.Client) -> None:
    response = http.post("/v1/embeddings", json={"input": "hi", "model": "gpt-4"})
    assert response.status_code == 404
    assert response.json()["error"]["code"] == "model_not_found"


def test_unknown_route_and_wrong_method_get_json_errors(http: httpx.Client) -> None:
    missing = http.get("/v1/nothing")
    assert missing.status_code == 404
    assert missing.json()["error"]["message"] == "No route for GET /v1/nothing."
    wrong = http.get("/v1/embeddings")
    assert wrong.status_code == 405
    assert "not allowed" in wrong.json()["error"]["message"]


def test_health_ping_and_models(http: httpx.Client) -> None:
    for path in ("/health", "/health/ready", "/ping"):
        response = http.get(path)
        assert response.status_code == 200
        body = response.json()
        assert body["status"] == "ok"
        assert set(body["engine"]) == {"queued_inputs", "queued_tokens", "busy_seconds"}
    assert http.get("/health/live").json() == {"status": "ok"}
    models = http.get("/v1/models").json()
    assert models["object"] == "list"
    assert models["data"][0]["id"] == BUNDLED_MODEL_NAME
    assert models["data"][0]["max_model_len"] == 256


def test_request_ids_are_echoed_or_generated(http: httpx.Client) -> None:
    assert http.get("/health", headers={"x-request-id": "abc-123"}).headers["x-request-id"] == "abc-123"
    generated = http.get("/health").headers["x-request-id"]
    assert len(generated) == 32
    assert http.get("/health", headers={"x-request-id": "has space"}).headers["x-request-id"] != "has space"


def test_vllms_base64_dtypes_and_byte_orders_decode_to_the_float_answer(server: InProcessServer) -> None:
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused")
    floats = client.embeddings.create(model=BUNDLED_MODEL_NAME, input=SENTENCES[:4], encoding_format="float")
    want = np.asarray([d.embedding for d in floats.data], dtype=np.float32)
    # (dtype, byte order, how numpy reads it, relative precision)
    for embed_dtype, endianness, read, precision in [
        ("float16", "big", ">f2", 1e-3),
        ("float16", "little", "<f2", 1e-3),
        ("bfloat16", "big", ">u2", 8e-3),
        ("float32", "big", ">f4", 0.0),
    ]:
        extra = {"embed_dtype": embed_dtype, "endianness": endianness}
        raw = client.embeddings.create(
            model=BUNDLED_MODEL_NAME, input=SENTENCES[:4], encoding_format="base64", extra_body=extra
        )
        rows = [np.frombuffer(base64.b64decode(d.embedding), dtype=read) for d in raw.data]  # type: ignore[arg-type]
        if embed_dtype == "bfloat16":
            rows = [(row.astype(np.uint32) << 16).view(np.float32) for row in rows]
        np.testing.assert_allclose(np.stack(rows).astype(np.float32), want, rtol=precision, atol=precision * 1e-2)
    with pytest.raises(openai.BadRequestError) as refused:
        client.embeddings.create(model=BUNDLED_MODEL_NAME, input="hi", extra_body={"embed_dtype": "int4"})
    assert refused.value.body["param"] == "embed_dtype"  # type: ignore[index]
    with pytest.raises(openai.BadRequestError) as unknown:
        client.embeddings.create(model=BUNDLED_MODEL_NAME, input="hi", extra_body={"cache_salt": "s"})
    assert unknown.value.body["param"] == "cache_salt"  # type: ignore[index]


def test_use_activation_and_add_special_tokens_reach_the_real_engine(
    http: httpx.Client, token_ids: list[list[int]]
) -> None:
    raw = embed(http, input=SENTENCES[:2], use_activation=False)
    pooled = http.post("/pooling", json={"input": SENTENCES[:2], "normalize": False}).json()["data"]
    np.testing.assert_allclose(raw, [d["data"] for d in pooled], atol=1e-5)
    assert not np.allclose(np.linalg.norm(raw, axis=1), 1.0)
    bare = embed(http, input=SENTENCES[:2], add_special_tokens=False)
    np.testing.assert_allclose(bare, embed(http, input=[ids[1:-1] for ids in token_ids[:2]]), atol=1e-6)
