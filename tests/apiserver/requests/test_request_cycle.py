"""Every endpoint family through the real Starlette app and request cycle, with an in-process engine.

The engine is an InProcessEngine whose rows are computed from the token ids (and pixels) it is
sent, so each answer can be checked against the tokenizer; no socket, no engine process, and every
test runs in milliseconds. tests/e2e/ shows the same endpoints on the real engine.
"""

from __future__ import annotations

import base64
import threading
from typing import Any

import msgspec
import numpy as np
import pytest

from apiserver.requests.endpoints import post
from apiserver.requests.inputs.job import EngineJob
from apiserver.requests.operation import Operation, Plan, Rows
from apiserver.requests.preprocess import INLINE_MAX_BYTES
from apiserver.requests.responses import encode_json
from apiserver.requests.state import AppState
from engine_client import EngineError, EngineOverloaded, EngineUnavailable, PooledResult
from poolserve.protocol import EngineRequest
from tests.apiserver.served_app import CLASSIFIER_CHANGES, CLIP_CHANGES, DIM, MESSAGE, PIXEL_PNG, text_row


def test_embeddings_are_the_engine_rows_of_the_tokenized_inputs(serve: Any) -> None:
    served = serve()
    body = served.post("/v1/embeddings", {"input": ["hello", "big world"]})
    expected = [text_row(served.tokens(text), DIM) for text in ("hello", "big world")]
    assert [item["embedding"] for item in body["data"]] == expected
    assert [item["index"] for item in body["data"]] == [0, 1]
    tokens = sum(len(served.tokens(text)) for text in ("hello", "big world"))
    assert body["usage"] == {"prompt_tokens": tokens, "total_tokens": tokens}
    assert body["model"] == "sentence-transformers/all-MiniLM-L6-v2"
    [sent] = served.engine.requests
    assert sent.lengths == [len(served.tokens("hello")), len(served.tokens("big world"))]


def test_base64_embeddings_decode_to_the_float_rows_and_dimensions_reach_the_engine(serve: Any) -> None:
    served = serve()
    body = served.post("/v1/embeddings", {"input": "hello", "encoding_format": "base64", "dimensions": 4})
    vector = np.frombuffer(base64.b64decode(body["data"][0]["embedding"]), dtype="<f4")
    assert vector.tolist() == text_row(served.tokens("hello"), DIM)[:4]
    assert served.engine.requests[0].params.dimensions == 4


def test_pooling_passes_normalize_and_activation_to_the_engine(serve: Any) -> None:
    served = serve()
    body = served.post("/pooling", {"input": [[101, 7, 102]], "normalize": False})
    assert body["data"][0]["data"] == text_row([101, 7, 102], DIM)
    assert body["id"].startswith("pool-")
    assert served.engine.requests[0].params.normalize is False
    classifier = serve(card=CLASSIFIER_CHANGES)
    classifier.post("/pooling", {"input": [[101, 7, 102]], "activation": False})
    assert classifier.engine.requests[0].params.activation is False


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/embeddings", {"input": "hi"}),
        ("/pooling", {"input": "hi"}),
        ("/score", {"text_1": "a", "text_2": "b"}),
        ("/v1/rerank", {"query": "a", "documents": ["b"]}),
        ("/rerank", {"query": "a", "texts": ["b"]}),
        ("/embed", {"inputs": "hi"}),
    ],
)
def test_a_requests_priority_reaches_the_engine_and_is_bounded(serve: Any, path: str, body: dict[str, Any]) -> None:
    served = serve()
    served.post(path, {**body, "priority": -7})
    assert served.engine.requests[-1].priority == -7
    served.post(path, body)
    assert served.engine.requests[-1].priority == 0
    # TEI's routes answer a body that does not fit the request type as TEI does: 422, TEI's shape.
    is_tei = path == "/embed"
    refused = served.post(path, {**body, "priority": 2**31}, status=422 if is_tei else 400)
    assert "priority" in (refused["error"] if is_tei else refused["error"]["message"])
    # More urgent than the operator allows (--min-priority, -100 by default): refused, never sent.
    sent = len(served.engine.requests)
    served.post(path, {**body, "priority": -100})
    in_tei_style = path in ("/embed", "/rerank")  # TEI answers its validation errors 413
    too_urgent = served.post(path, {**body, "priority": -101}, status=413 if in_tei_style else 400)
    message = "priority -101 is more urgent than this server allows: the lowest accepted is -100 (--min-priority)."
    assert (too_urgent["error"] if in_tei_style else too_urgent["error"]["message"]) == message
    strict = serve(config={"min_priority": 0})
    strict.post(path, {**body, "priority": 1})
    strict.post(path, {**body, "priority": -1}, status=413 if in_tei_style else 400)
    assert len(served.engine.requests) == sent + 1 and len(strict.engine.requests) == 1


def test_texts_and_images_come_back_in_request_order(serve: Any) -> None:
    served = serve(card=CLIP_CHANGES)
    body = served.post("/v1/embeddings", {"input": [{"image": PIXEL_PNG}, "hello"]})
    first, second = (item["embedding"] for item in body["data"])
    assert first[0] == -1.0 and second == text_row(served.tokens("hello"), DIM)
    assert served.engine.requests[0].images == 1


def cosine(a: list[float], b: list[float]) -> float:
    return float(np.dot(a, b) / np.linalg.norm(a) / np.linalg.norm(b))


def test_score_by_cosine_is_the_cosine_of_the_engine_rows(serve: Any) -> None:
    served = serve()
    body = served.post("/score", {"text_1": "a cat", "text_2": ["a kitten", "a dog"]})
    left = text_row(served.tokens("a cat"), DIM)
    expected = [cosine(left, text_row(served.tokens(t), DIM)) for t in ("a kitten", "a dog")]
    np.testing.assert_allclose([item["score"] for item in body["data"]], expected, rtol=1e-6)
    assert served.engine.requests[0].params.normalize is True  # a bi-encoder scores normalized vectors


def test_rerank_ranks_best_first_in_both_dialects(serve: Any) -> None:
    served = serve()
    documents = ["zebra zebra zebra", "a", "apple pie"]
    left = text_row(served.tokens("q"), DIM)
    scores = [cosine(left, text_row(served.tokens(d), DIM)) for d in documents]
    best_first = sorted(range(3), key=lambda i: -scores[i])
    body = served.post("/v1/rerank", {"query": "q", "documents": documents, "top_n": 2})
    assert [r["index"] for r in body["results"]] == best_first[:2]
    assert body["results"][0]["document"] == {"text": documents[best_first[0]]}
    tei = served.post("/rerank", {"query": "q", "texts": documents, "return_text": True})
    assert [r["index"] for r in tei] == best_first and tei[0]["text"] == documents[best_first[0]]


def test_classify_and_predict_label_the_engine_rows(serve: Any) -> None:
    served = serve(card=CLASSIFIER_CHANGES)
    body = served.post("/classify", {"input": ["I love it"]})
    row = text_row(served.tokens("I love it"), 3)
    assert body["data"][0]["label"] == CLASSIFIER_CHANGES["labels"][int(np.argmax(row))]
    assert body["data"][0]["probs"] == row
    single = served.post("/predict", {"inputs": "I love it"})
    assert [p["score"] for p in single] == sorted(row, reverse=True)
    batch = served.post("/predict", {"inputs": ["I love it", "meh", "ok"]})  # two strings would be one pair
    assert len(batch) == 3 and batch[0] == single


def test_tei_embed_truncates_from_the_side_asked(serve: Any) -> None:
    served = serve(card={"max_model_len": 8})
    text = "one two three four five six seven eight nine ten"
    right = served.post("/embed", {"inputs": text, "truncate": True})
    left = served.post("/embed", {"inputs": text, "truncate": True, "truncation_direction": "Left"})
    assert right[0][0] == left[0][0] == 8.0
    assert right != left
    refused = served.post("/embed", {"inputs": text}, status=413)  # TEI's status and shape
    assert refused["error_type"] == "Validation"
    assert "more than the model's maximum of 8" in refused["error"]


def test_tokenizer_endpoints_never_reach_the_engine(serve: Any) -> None:
    served = serve()
    body = served.post("/tokenize", {"prompt": "Hello world"})
    assert body["tokens"] == served.tokens("Hello world")
    tei = served.post("/tokenize", {"inputs": ["Hello world"]})
    assert [t["id"] for t in tei[0]] == body["tokens"]
    assert served.post("/detokenize", {"tokens": [7592, 2088]}) == {"prompt": "hello world"}
    assert served.engine.requests == []


@pytest.mark.parametrize(
    ("path", "body", "param", "card"),
    [
        ("/v1/embeddings", {"input": ["a"] * 3}, "input", {}),
        ("/pooling", {"input": ["a"] * 3}, "input", {}),
        ("/embed", {"inputs": ["a"] * 3}, "inputs", {}),
        ("/tokenize", {"inputs": ["a"] * 3}, "inputs", {}),
        ("/score", {"text_1": "q", "text_2": ["a"] * 3}, "text_2", {}),
        ("/rerank", {"query": "q", "documents": ["a"] * 3}, "documents", {}),
        ("/rerank", {"query": "q", "texts": ["a"] * 3}, "texts", {}),
        ("/classify", {"input": ["a"] * 3}, "input", CLASSIFIER_CHANGES),
        ("/predict", {"inputs": ["a"] * 3}, "inputs", CLASSIFIER_CHANGES),
    ],
)
def test_too_many_inputs_is_one_message_on_every_endpoint(
    serve: Any, path: str, body: dict[str, Any], param: str, card: dict[str, Any]
) -> None:
    served = serve(card=card, config={"max_inputs_per_request": 2})
    message = MESSAGE.format(param=param, count=3, limit=2)
    if param in ("inputs", "texts"):  # a TEI body: TEI's status and shape
        assert served.post(path, body, status=413) == {"error": message, "error_type": "Validation"}
        return
    error = served.post(path, body, status=400)["error"]
    assert error == {
        "message": message,
        "type": "invalid_request_error",
        "param": param,
        "code": "too_many_inputs",
    }
    assert served.engine.requests == []


def test_token_image_and_queue_limits_stop_a_request_before_the_engine(serve: Any) -> None:
    served = serve(card=CLIP_CHANGES, config={"max_tokens_per_request": 5, "max_images_per_request": 1})
    tokens = served.post("/v1/embeddings", {"input": "one two three four five six"}, status=400)["error"]
    assert tokens["code"] == "too_many_tokens"
    assert "limit of 5 per request (--max-tokens-per-request)" in tokens["message"]
    images = served.post("/v1/embeddings", {"input": [{"image": PIXEL_PNG}] * 2}, status=400)["error"]
    assert images["code"] == "too_many_images"
    assert "limit of 1 per request (--max-images-per-request)" in images["message"]
    queue = serve(config={"max_queued_inputs": 1})
    message = queue.post("/v1/embeddings", {"input": ["a", "b"]}, status=413)["error"]["message"]
    assert f"whole queue of the model {queue.state.model_name!r}" in message, message
    assert served.engine.requests == queue.engine.requests == []


@pytest.mark.parametrize(
    ("error", "status", "code"),
    [
        (EngineOverloaded("full"), 429, "overloaded"),
        (EngineUnavailable("gone"), 503, "engine_unavailable"),
        (EngineError("boom"), 500, "engine_error"),
    ],
)
def test_engine_errors_become_their_http_status(serve: Any, error: Exception, status: int, code: str) -> None:
    def fail(request: EngineRequest) -> PooledResult:
        raise error

    served = serve(engine_answer=fail)
    assert served.post("/v1/embeddings", {"input": "a"}, status=status)["error"]["code"] == code


def test_parsing_and_encoding_are_timed_apart(serve: Any) -> None:
    served = serve()
    response = served.client.post("/v1/embeddings", json={"input": ["hello"] * 100})
    assert response.status_code == 200
    for header in ("x-tokenization-time", "x-encoding-time", "x-queue-time", "x-inference-time"):
        assert float(response.headers[header]) >= 0
    assert response.headers["x-compute-tokens"] == str(100 * len(served.tokens("hello")))


class Echo(msgspec.Struct, kw_only=True):
    texts: list[str]


def parse_echo(request: Echo, state: AppState) -> Plan[list[str]]:
    threads.append(("parse", threading.current_thread().name))
    return Plan([], job=EngineJob(rows=state.tokenizer.encode(request.texts)))


async def parse_echo_async(request: Echo, state: AppState) -> Plan[list[str]]:
    threads.append(("parse", threading.current_thread().name))
    return Plan([], job=EngineJob(rows=state.tokenizer.encode(request.texts)))


def render_echo(plan: Plan[list[str]], rows: Rows, state: AppState) -> bytes:
    threads.append(("render", threading.current_thread().name))
    return encode_json({"firsts": rows[:, 0].tolist()})


threads: list[tuple[str, str]] = []


@pytest.mark.parametrize("parse", [parse_echo, parse_echo_async])
def test_parse_and_render_of_a_big_request_run_off_the_event_loop(serve: Any, parse: Any) -> None:
    threads.clear()
    echo = post("/echo", Operation(Echo, parse, render_echo), "Echo.", "test", None)
    served = serve(extra=[echo])
    texts = ["word"] * (INLINE_MAX_BYTES // 4)
    body = served.post("/echo", {"texts": texts})
    assert body == {"firsts": [float(len(served.tokens("word")))] * len(texts)}
    where = dict(threads)
    # A sync parse runs on the pool; an async one is awaited on the loop (the test client's thread).
    assert where["parse"].startswith("preprocess") == (parse is parse_echo)
    assert where["render"].startswith("preprocess")


def test_token_id_inputs_are_cut_from_the_side_the_request_names(serve: Any) -> None:
    """vLLM's `truncation_side` and TEI's `truncation_direction` cut token-id inputs as they cut texts."""
    served = serve()
    ids = list(range(1000, 1011))
    for side, kept in (("right", ids[:3]), ("left", ids[-3:])):
        body = {"input": [ids], "truncate_prompt_tokens": 3, "truncation_side": side}
        assert served.post("/v1/embeddings", body)["data"][0]["embedding"] == text_row(kept, DIM)
    last_tokens = served.state.card.max_model_len
    long_ids = list(range(1000, 1000 + last_tokens + 5))
    tei = served.post("/embed", {"inputs": [long_ids], "truncate": True, "truncation_direction": "Left",
                                 "normalize": False})  # fmt: skip
    assert tei == [text_row(long_ids[-last_tokens:], DIM)]


def test_decoding_is_bounded_by_the_tokens_a_request_may_send(serve: Any) -> None:
    """A body of ids decodes to an answer several times its size: /decode and /detokenize take at most
    --max-tokens-per-request ids, as /tokenize answers at most that many."""
    served = serve(config={"max_tokens_per_request": 10})
    ids = served.tokens("hello world, a sentence of more than ten tokens in all")[:10]
    assert len(ids) == 10
    assert served.post("/detokenize", {"tokens": ids})["prompt"]
    assert served.post("/decode", {"ids": [ids[:5], ids[5:]]})
    refused = served.post("/detokenize", {"tokens": ids + ids[:1]}, status=400)
    assert refused["error"]["code"] == "too_many_tokens" and "--max-tokens-per-request" in refused["error"]["message"]
    tei = served.client.post("/decode", json={"ids": [ids, ids]})
    assert tei.status_code == 413 and "--max-tokens-per-request" in tei.json()["error"], tei.text
