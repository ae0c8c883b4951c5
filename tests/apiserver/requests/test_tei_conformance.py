"""TEI's routes against TEI's published OpenAPI document (tests/data/tei-openapi.json): every answer and every
error body, through the real app with an in-process engine (conftest.py's `serve`)."""

from __future__ import annotations

import base64
import json
import re
from pathlib import Path
from typing import Any

import jsonschema_rs
import numpy as np
import pytest

from engine_client import EngineError, EngineOverloaded, EngineUnavailable, PooledResult
from poolserve.protocol import EngineRequest
from tests.apiserver.served_app import CLASSIFIER_CHANGES, DIM, answering, text_row

SPEC = json.loads((Path(__file__).parents[2] / "data" / "tei-openapi.json").read_text())
RERANKER_CHANGES: dict[str, Any] = {
    **CLASSIFIER_CHANGES, "tasks": ["classify", "score", "pool", "tokenize"], "output_size": 1, "labels": ["LABEL_0"],
    "activation": "sigmoid",
}  # fmt: skip
EMBEDDING_TASKS = ["embed", "score", "pool", "tokenize", "token_embed"]


def as_json_schema(node: Any) -> Any:
    """OpenAPI 3.0's `nullable` as JSON Schema says it: null is one more type."""
    if isinstance(node, list):
        return [as_json_schema(item) for item in node]
    if not isinstance(node, dict):
        return node
    converted = {key: as_json_schema(value) for key, value in node.items()}
    if converted.pop("nullable", False):
        return {"anyOf": [converted, {"type": "null"}]}
    return converted


COMPONENTS = as_json_schema(SPEC["components"])


def check(schema: dict[str, Any], body: Any) -> None:
    jsonschema_rs.Draft202012Validator({**schema, "components": COMPONENTS}).validate(body)


def check_answer(path: str, method: str, status: int, body: Any) -> None:
    """Valid as TEI documents `path`'s answer with `status`; an error status the document does not list
    (401, 405, 503, ...) must still be TEI's ErrorResponse."""
    responses = SPEC["paths"][path][method]["responses"]
    if str(status) in responses:
        check(responses[str(status)]["content"]["application/json"]["schema"], body)
    else:
        assert status >= 400, f"TEI documents no {status} for {path}"
        check({"$ref": "#/components/schemas/ErrorResponse"}, body)


def per_token(request: EngineRequest) -> PooledResult:
    """The fake engine, answering a per-token request with one row per token: [id, position, 0, ...]."""
    if not request.params.per_token:
        return answering(DIM)(request)
    positions = [k for length in request.lengths for k in range(length)]
    rows = [
        [float(token), float(k), *([0.0] * (DIM - 2))]
        for token, k in zip(request.tokens.tolist(), positions, strict=True)
    ]
    return PooledResult(np.asarray(rows, dtype=np.float32))


def test_every_tei_answer_is_what_tei_documents(serve: Any) -> None:
    embedder = serve(card={"tasks": EMBEDDING_TASKS}, engine_answer=per_token)
    answers = [
        ("/embed", {"inputs": ["hello", "big world"]}),
        ("/embed", {"inputs": "hello"}),
        ("/embed_all", {"inputs": ["hello", "big world"]}),
        ("/similarity", {"inputs": {"source_sentence": "hello", "sentences": ["hi", "big world"]}}),
        ("/tokenize", {"inputs": ["hello", "big world"]}),
        ("/decode", {"ids": [[101, 7592, 102], [7592]]}),
        ("/decode", {"ids": [101, 7592, 102]}),
    ]
    for path, body in answers:
        check_answer(path, "post", 200, embedder.post(path, body))
    info = embedder.client.get("/info").json()
    check_answer("/info", "get", 200, info)
    assert info["served_model_name"] == "sentence-transformers/all-MiniLM-L6-v2"
    classifier = serve(card=CLASSIFIER_CHANGES)
    check_answer("/predict", "post", 200, classifier.post("/predict", {"inputs": ["good", "bad"]}))
    check_answer("/info", "get", 200, classifier.client.get("/info").json())
    reranker = serve(card=RERANKER_CHANGES)
    check_answer("/rerank", "post", 200, reranker.post("/rerank", {"query": "q", "texts": ["a", "b"]}))


def test_embed_all_answers_each_tokens_state_unnormalized(serve: Any) -> None:
    served = serve(card={"tasks": EMBEDDING_TASKS}, engine_answer=per_token)
    body = served.post("/embed_all", {"inputs": ["hello", "big world"]})
    for text, states in zip(["hello", "big world"], body, strict=True):
        ids = served.tokens(text)
        assert [row[:2] for row in states] == [[float(token), float(k)] for k, token in enumerate(ids)]
    [sent] = served.engine.requests
    assert (sent.params.per_token, sent.params.normalize) == (True, False)


def test_a_per_token_answer_is_bounded_by_its_values(serve: Any) -> None:
    served = serve(card={"tasks": EMBEDDING_TASKS, "output_size": 4096, "max_model_len": 8192}, engine_answer=per_token)
    error = served.post("/embed_all", {"inputs": "word " * 2100}, status=413)  # 2102 tokens x 4096 > 8 Mi values
    assert error["error_type"] == "Validation" and "limit of 2048" in error["error"]
    refused = served.post("/pooling", {"input": "word " * 2100, "task": "token_embed"}, status=400)
    assert refused["error"]["code"] == "too_many_tokens"
    assert served.engine.requests == []


def test_decode_and_similarity_answer_as_tei(serve: Any) -> None:
    served = serve()
    assert served.post("/decode", {"ids": [101, 7592, 102]}) == ["hello"]
    assert served.post("/decode", {"ids": [[101, 7592, 102]], "skip_special_tokens": False}) == ["[CLS] hello [SEP]"]
    scores = served.post("/similarity", {"inputs": {"source_sentence": "hello", "sentences": ["hello", "big"]}})
    assert scores[0] == pytest.approx(1.0)
    source, other = (np.asarray(text_row(served.tokens(t), DIM)) for t in ("hello", "big"))
    assert scores[1] == pytest.approx(source @ other / np.linalg.norm(source) / np.linalg.norm(other), rel=1e-5)


@pytest.mark.parametrize(
    ("card", "route", "body"),
    [
        ({}, "/embed", {"inputs": ["hello"]}),
        (CLASSIFIER_CHANGES, "/predict", {"inputs": ["good"]}),
        (RERANKER_CHANGES, "/rerank", {"query": "q", "texts": ["a", "b"]}),
    ],
)
def test_post_root_and_invocations_answer_as_the_route_tei_picks_for_the_model(
    serve: Any, card: dict[str, Any], route: str, body: dict[str, Any]
) -> None:
    served = serve(card=card)
    expected = served.post(route, body)
    assert served.post("/", body) == served.post("/invocations", body) == expected
    assert served.client.get("/").status_code == 200  # TEI's GET / is its health check


def test_post_root_of_an_embedding_model_compares_a_similarity_body(serve: Any) -> None:
    """What huggingface_hub's InferenceClient.sentence_similarity sends to a bare URL."""
    served = serve()
    body = {"inputs": {"source_sentence": "hello", "sentences": ["hi", "big"]}, "parameters": {}}
    assert served.post("/", body) == served.post("/similarity", body)


@pytest.mark.parametrize(
    ("card", "path", "body", "answer"),
    [
        ({}, "/embed", {"inputs": []}, (400, "Empty")),
        ({}, "/embed", {"inputs": 5}, (422, "Validation")),
        ({}, "/embed", {"inputs": "x " * 300}, (413, "Validation")),
        ({}, "/embed", {"inputs": ["a"] * 3000}, (413, "Validation")),
        ({}, "/embed_all", {"inputs": "hi"}, (424, "Backend")),  # a card without token states
        ({}, "/embed_sparse", {"inputs": "hi"}, (424, "Backend")),
        ({}, "/predict", {"inputs": "hi"}, (424, "Backend")),
        (CLASSIFIER_CHANGES, "/embed", {"inputs": "hi"}, (424, "Backend")),
        ({}, "/similarity", {"inputs": {"source_sentence": "a", "sentences": []}}, (400, "Empty")),
        ({}, "/tokenize", {"inputs": []}, (400, "Empty")),
        ({}, "/tokenize", {"inputs": "a", "prompt_name": "query"}, (413, "Validation")),
        (
            {},
            "/similarity",
            {"inputs": {"source_sentence": "a", "sentences": ["b"]}, "parameters": {"prompt_name": "q"}},
            (413, "Validation"),
        ),
        ({}, "/decode", {"ids": [1, [2]]}, (413, "Validation")),
        ({}, "/rerank", {"query": "q", "texts": []}, (400, "Empty")),
    ],
)
def test_tei_errors_have_teis_shape_type_and_status(
    serve: Any, card: dict[str, Any], path: str, body: dict[str, Any], answer: tuple[int, str]
) -> None:
    status, error_type = answer
    served = serve(card=card)
    error = served.post(path, body, status=status)
    assert error["error_type"] == error_type
    check_answer(path, "post", status, error)


def test_a_body_that_is_not_json_is_a_tei_400_on_tei_routes_and_an_openai_400_elsewhere(serve: Any) -> None:
    served = serve()
    for path in ("/embed", "/", "/invocations", "/embed_all"):
        response = served.client.post(path, content=b"{")
        assert response.status_code == 400
        check_answer(path if path in SPEC["paths"] else "/embed", "post", 400, response.json())
    assert served.client.post("/v1/embeddings", content=b"{").json()["error"]["code"] == "invalid_json"
    wrong_method = served.client.get("/embed")
    assert wrong_method.status_code == 405 and wrong_method.json()["error_type"] == "Validation"


@pytest.mark.parametrize(
    ("failure", "status", "error_type", "openai_status"),
    [
        (EngineOverloaded("queue full"), 429, "Overloaded", 429),
        (EngineError("boom"), 424, "Backend", 500),
        (EngineUnavailable("gone"), 503, "Unhealthy", 503),
    ],
)
def test_engine_failures_on_tei_routes_are_teis(
    serve: Any, failure: Exception, status: int, error_type: str, openai_status: int
) -> None:
    def fail(request: EngineRequest) -> PooledResult:
        raise failure

    served = serve(engine_answer=fail)
    answer = served.post("/embed", {"inputs": "hi"}, status=status)
    assert answer["error_type"] == error_type
    check_answer("/embed", "post", status, answer)
    # A shared route keeps OpenAI's shape for a vLLM body, TEI's for a TEI body.
    assert "type" in served.post("/rerank", {"query": "q", "documents": ["a"]}, status=openai_status)["error"]
    assert served.post("/rerank", {"query": "q", "texts": ["a"]}, status=status)["error_type"] == error_type


def test_errors_before_the_route_follow_its_family(serve: Any) -> None:
    served = serve(config={"api_key": "secret", "max_request_bytes": 64 * 1024})
    unauthorized = served.client.post("/embed", json={"inputs": "hi"})
    assert unauthorized.status_code == 401
    check_answer("/embed", "post", 401, unauthorized.json())
    assert served.client.post("/v1/embeddings", json={"input": "hi"}).json()["error"]["code"] == "invalid_api_key"
    headers = {"authorization": "Bearer secret"}
    too_large = served.client.post("/embed", json={"inputs": "x" * 70000}, headers=headers)
    assert too_large.status_code == 413 and too_large.json()["error_type"] == "Validation"
    check_answer("/embed", "post", 413, too_large.json())


def test_pooling_tasks_run_where_the_model_can_and_are_refused_by_name_elsewhere(serve: Any) -> None:
    served = serve(card={"tasks": EMBEDDING_TASKS}, engine_answer=per_token)
    body = served.post("/pooling", {"input": ["hello"], "task": "token_embed"})
    ids = served.tokens("hello")
    assert [row[:2] for row in body["data"][0]["data"]] == [[float(token), float(k)] for k, token in enumerate(ids)]
    assert (served.engine.requests[-1].params.per_token, served.engine.requests[-1].params.normalize) == (True, True)
    assert len(served.post("/pooling", {"input": ["hello"], "task": "embed"})["data"][0]["data"]) == DIM
    for task in ("classify", "token_classify", "score", "encode", "plugin"):
        error = served.post("/pooling", {"input": "hello", "task": task}, status=400)["error"]
        assert (error["param"], error["code"]) == ("task", "task_not_supported")
        assert repr(task) in error["message"]
    classifier = serve(card=CLASSIFIER_CHANGES)
    assert len(classifier.post("/pooling", {"input": "good", "task": "classify"})["data"][0]["data"]) == 3
    for task in ("embed", "token_embed"):
        classifier.post("/pooling", {"input": "good", "task": task}, status=400)


@pytest.mark.parametrize(
    ("embed_dtype", "endianness", "dtype"), [("float32", "native", "=f4"), ("float16", "big", ">f2")]
)
def test_per_token_base64_takes_vllms_embed_dtype_and_endianness(
    serve: Any, embed_dtype: str, endianness: str, dtype: str
) -> None:
    served = serve(card={"tasks": EMBEDDING_TASKS}, engine_answer=per_token)
    body = {"input": "hello", "task": "token_embed", "normalize": False, "encoding_format": "base64"}
    data = served.post("/pooling", {**body, "embed_dtype": embed_dtype, "endianness": endianness})["data"][0]["data"]
    matrix = np.frombuffer(base64.b64decode(data), dtype=dtype).reshape(-1, DIM)
    ids = served.tokens("hello")
    assert matrix[:, :2].tolist() == [[float(token), float(k)] for k, token in enumerate(ids)]


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/embed", {"inputs": "hi"}), ("/embed_all", {"inputs": "hi"}), ("/decode", {"ids": [7592]}),
        ("/similarity", {"inputs": {"source_sentence": "a", "sentences": ["b"]}}),
    ],
)  # fmt: skip
def test_tei_routes_ignore_a_field_tei_does_not_define_as_tei_does(serve: Any, path: str, body: dict[str, Any]) -> None:
    """TEI's request types take serde's default (no deny_unknown_fields): huggingface_hub's InferenceClient
    sends `parameters` to /predict that TEI never reads, and would break on a refusal."""
    served = serve(card={"tasks": EMBEDDING_TASKS}, engine_answer=per_token)
    assert served.post(path, {**body, "not_a_tei_field": 1}) == served.post(path, body)
    classifier = serve(card=CLASSIFIER_CHANGES)
    predict = {"inputs": "good"}
    assert classifier.post("/predict", {**predict, "parameters": {}}) == classifier.post("/predict", predict)


def test_tokenize_refuses_a_field_no_peer_defines_in_either_form(serve: Any) -> None:
    """/tokenize's one request type serves vLLM's form and TEI's: a field neither defines is refused by name
    (vLLM's chat form, `messages` and the rest, with it: poolserve applies no chat template)."""
    served = serve(card={"tasks": EMBEDDING_TASKS})
    for body in ({"inputs": "hi"}, {"prompt": "hi"}):
        error = served.post("/tokenize", {**body, "messages": []}, status=400)["error"]
        assert error["param"] == "messages"


def test_the_openapi_document_names_tei_errors_on_tei_routes(serve: Any) -> None:
    document = serve().client.get("/openapi.json").json()
    default_error = document["paths"]["/embed"]["post"]["responses"]["default"]["content"]["application/json"]
    assert default_error["schema"] == {"$ref": "#/components/schemas/TeiErrorBody"}
    assert "/invocations" in document["paths"] and "post" in document["paths"]["/"]


def test_a_path_served_with_two_methods_allows_both(serve: Any) -> None:
    refused = serve().client.put("/", json={})
    assert refused.status_code == 405 and set(refused.headers["allow"].split(", ")) == {"GET", "HEAD", "POST"}


def test_the_tei_compatibility_table_names_every_route_and_request_field_of_teis_document() -> None:
    docs = (Path(__file__).parents[3] / "docs" / "api.md").read_text()
    table = docs.split("## Compatibility: TEI", 1)[1].split("\n## ", 1)[0]
    rows = [line.split("|")[1:4] for line in table.splitlines() if line.startswith("| `")]
    named: dict[str, str] = {}
    for route, fields, _ in rows:
        for path in re.findall(r"`(?:[A-Z]+ )?(/[\w/]*)`", route):
            named[path] = named.get(path, "") + fields
    for path, methods in SPEC["paths"].items():
        assert path in named, f"{path} has no row"
        body = methods.get("post", {}).get("requestBody")
        if body is None or path == "/v1/embeddings":  # OpenAI's fields: the OpenAI section's table
            continue
        schema = SPEC["components"]["schemas"][body["content"]["application/json"]["schema"]["$ref"].rsplit("/")[-1]]
        for field in schema["properties"]:
            assert f"`{field}" in named[path] or f".{field}`" in named[path] or "all" in named[path], (path, field)
