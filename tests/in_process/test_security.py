"""Hostile input and access on the API server and engine of `launch` (stack_server.py): keys, limits, hostile bodies
and images, SSRF, CORS. What needs the processes, their sockets or a connection by hand: tests/e2e/test_security.py."""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import msgspec
import pytest
from PIL import Image

from apiserver.connection.auth import OPEN_PATHS
from apiserver.requests.endpoints import ENDPOINTS
from tests.conftest import (
    API_KEY,
    CORS_ORIGIN,
    GUARDED_BODY_LIMIT,
    GUARDED_TOKEN_LIMIT,
)
from tests.images import bomb_png, data_url, encode, make_image
from tests.in_process.stack_server import InProcessServer, served

KEY, ORIGIN, BODY_LIMIT, TOKEN_LIMIT = API_KEY, CORS_ORIGIN, GUARDED_BODY_LIMIT, GUARDED_TOKEN_LIMIT
IMAGE_LIMIT = 4
NORMAL = {"input": ["a normal sentence about the weather in spring"]}
JSON = {"content-type": "application/json"}

# A request with the right key to each model endpoint of the bundled model, and what it gets.
SAMPLES: dict[str, tuple[dict[str, Any], int]] = {
    "/v1/embeddings": ({"input": "hi"}, 200),
    "/pooling": ({"input": "hi"}, 200),
    "/score": ({"text_1": "a", "text_2": "b"}, 200),
    "/v1/score": ({"text_1": "a", "text_2": "b"}, 200),
    "/rerank": ({"query": "a", "documents": ["b"]}, 200),
    "/v1/rerank": ({"query": "a", "documents": ["b"]}, 200),
    "/v2/rerank": ({"query": "a", "documents": ["b"]}, 200),
    "/classify": ({"input": "hi"}, 400),  # an embedding model: task_not_supported, past the key
    "/tokenize": ({"prompt": "hi"}, 200),
    "/detokenize": ({"tokens": [7592]}, 200),
    "/embed": ({"inputs": "hi"}, 200),
    "/predict": ({"inputs": "hi"}, 424),  # TEI's answer for a model that is not a classifier
    "/embeddings": ({"input": "hi"}, 200),
    "/embed_all": ({"inputs": "hi"}, 200),
    "/embed_sparse": ({"inputs": "hi"}, 424),  # no SPLADE pooling
    "/similarity": ({"inputs": {"source_sentence": "a", "sentences": ["b"]}}, 200),
    "/decode": ({"ids": [7592]}, 200),
}


@pytest.fixture(scope="module")
def guarded(guarded_server: InProcessServer) -> InProcessServer:
    return guarded_server


@pytest.fixture(scope="module")
def clip_default_media(clip_model: Path) -> Iterator[InProcessServer]:
    """A CLIP-style model with the default media policy: public URLs only."""
    with served(
        "--model", str(clip_model), "--max-images-per-request", str(IMAGE_LIMIT), "--image-fetch-timeout", "2",
    ) as started:  # fmt: skip
        yield started


def bearer(key: str = KEY) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"}


# API key ---------------------------------------------------------------------------------------------


def test_every_model_endpoint_refuses_a_missing_or_wrong_key_and_accepts_the_right_one(
    guarded: InProcessServer,
) -> None:
    with guarded.client() as client:
        for endpoint in ENDPOINTS:
            if endpoint.path in OPEN_PATHS:
                continue
            body, status = SAMPLES.get(endpoint.path, (None, 200))
            for headers in ({}, bearer("wrong"), bearer(KEY + "x"), {"authorization": KEY}):
                response = client.request(endpoint.method, endpoint.path, json=body, headers=headers)
                assert response.status_code == 401, (endpoint.path, headers, response.text)
                assert response.headers["www-authenticate"] == "Bearer"
                if endpoint.error_style == "tei":
                    assert response.json()["error_type"] == "Validation"
                else:
                    assert response.json()["error"]["code"] == "invalid_api_key"
            response = client.request(endpoint.method, endpoint.path, json=body, headers=bearer())
            assert response.status_code == status, (endpoint.path, response.text)
        assert client.get("/openapi.json").status_code == 401
        document = client.get("/openapi.json", headers=bearer()).json()
        assert document["components"]["securitySchemes"] == {"apiKey": {"type": "http", "scheme": "bearer"}}
        assert document["paths"]["/v1/embeddings"]["post"]["security"] == [{"apiKey": []}]
        assert document["paths"]["/health"]["get"]["security"] == []
        assert client.get("/no-such-path").status_code == 401


def test_probes_and_metrics_stay_open_without_a_key(guarded: InProcessServer) -> None:
    # Kubernetes' probes and Prometheus' scrapers are usually set up without credentials: without --protect-metrics,
    # /metrics is open beside the probes (behind a key with it: tests/e2e/test_security.py, on a launch).
    with guarded.client() as client:
        for path in OPEN_PATHS:
            response = client.get(path)
            assert response.status_code == 200, (path, response.text)
            assert response.json()["status"] == "ok", path
        metrics = client.get("/metrics")
    assert metrics.status_code == 200
    assert "# TYPE poolserve_" in metrics.text


def test_too_many_tokens_in_one_request_is_a_400_naming_the_limit(guarded: InProcessServer) -> None:
    with guarded.client(headers=bearer()) as client:
        over = client.post("/v1/embeddings", json={"input": ["word " * 60] * 40})
        assert over.status_code == 400
        assert over.json()["error"]["code"] == "too_many_tokens"
        assert f"limit of {TOKEN_LIMIT} per request (--max-tokens-per-request)" in over.json()["error"]["message"]
        assert client.post("/v1/embeddings", json={"input": ["word " * 60] * 20}).status_code == 200
        # Counted after truncation: what the model would run on.
        cut = {"input": ["word " * 300] * 30, "truncate_prompt_tokens": 50}
        assert client.post("/v1/embeddings", json=cut).status_code == 200


# hostile bodies: each a 4xx, and the server as fast afterwards ---------------------------------------


def median_latency(client: httpx.Client, body: dict[str, Any], count: int) -> float:
    times = []
    for _ in range(count):
        started = time.perf_counter()
        response = client.post("/v1/embeddings", json=body)
        times.append(time.perf_counter() - started)
        assert response.status_code == 200, response.text
    return statistics.median(times)


def assert_as_fast_as_before(client: httpx.Client, baseline: float) -> None:
    # Generous: this machine is shared, and one slow request says little; a wedged worker says a lot.
    after = median_latency(client, NORMAL, 5)
    assert after < max(4 * baseline, baseline + 0.5), f"{after:.3f}s after, {baseline:.3f}s before"


@pytest.fixture(scope="module")
def text_baseline(server: InProcessServer) -> float:
    with server.client() as client:
        median_latency(client, NORMAL, 2)  # warm up
        return median_latency(client, NORMAL, 7)


def json_body(value: object) -> bytes:
    return msgspec.json.encode(value)


HOSTILE_BODIES = {
    "deeply nested input": b'{"input": ' + b"[" * 200_000 + b"]" * 200_000 + b"}",
    "deeply nested unknown field": b'{"x": ' + b"[" * 200_000 + b"]" * 200_000 + b', "input": "hi"}',
    "deeply nested objects": b'{"x": ' + b'{"a": ' * 100_000 + b"1" + b"}" * 100_000 + b', "input": "hi"}',
    "a number past float": b'{"input": "hi", "dimensions": 1e400}',
    "a huge integer": b'{"input": "hi", "dimensions": 123456789012345678901234567890}',
    "a huge token id": b'{"input": [101, 123456789012345678901234567890, 102]}',
    "invalid UTF-8": b'{"input": "caf\xe9 \xff\xfe"}',
    "a lone surrogate": b'{"input": "\\ud800"}',
    "not JSON": b"\x89PNG\r\n\x1a\n" + os.urandom(512),
    "a body at the text model's 4 MiB limit": json_body({"input": [1] * 2_090_000}),
    "100k inputs": json_body({"input": ["a"] * 100_000}),
    "token ids past the vocabulary": json_body({"input": [[101, 30522, 102]]}),
    "negative token ids": json_body({"input": [[101, -1, 102]]}),
    "an image for a text model": json_body({"input": [{"image": "http://169.254.169.254/latest/meta-data/"}]}),
}


@pytest.mark.parametrize("case", list(HOSTILE_BODIES))
def test_hostile_bodies_get_a_400_and_the_server_stays_as_fast(
    server: InProcessServer, text_baseline: float, case: str
) -> None:
    body = HOSTILE_BODIES[case]
    if case == "a body at the text model's 4 MiB limit":
        assert 4_000_000 < len(body) <= 4 * 1024 * 1024
    with server.client() as client:
        started = time.perf_counter()
        response = client.post("/v1/embeddings", content=body, headers={"content-type": "application/json"})
        assert response.status_code == 400, response.text
        assert response.json()["error"]["type"] == "invalid_request_error"
        assert time.perf_counter() - started < 5
        assert_as_fast_as_before(client, text_baseline)


def test_a_token_id_past_the_vocabulary_is_refused_by_every_endpoint_that_takes_ids(server: InProcessServer) -> None:
    with server.client() as client:
        for path, body in [
            ("/v1/embeddings", {"input": [2**31]}),
            ("/pooling", {"input": [[5, 2**40]]}),
            ("/embed", {"inputs": [[30522]]}),
            ("/decode", {"ids": [30522]}),
            ("/detokenize", {"tokens": [2**63]}),
            ("/detokenize", {"tokens": [-5]}),
        ]:
            response = client.post(path, json=body)
            # TEI's routes refuse a value as TEI does: 413, `Validation`.
            expected = 413 if path in ("/embed", "/decode") else 400
            assert response.status_code == expected, (path, response.text)


def test_a_wrong_method_is_a_405_that_says_which_are_allowed(server: InProcessServer) -> None:
    with server.client() as client:
        response = client.get("/v1/embeddings")
        assert response.status_code == 405
        assert response.headers["allow"] == "POST"
        assert set(client.delete("/health").headers["allow"].split(", ")) == {"GET", "HEAD"}


# hostile images, and where image URLs may lead --------------------------------------------------------


@pytest.fixture(scope="module")
def clip_baseline(clip_default_media: InProcessServer) -> float:
    with clip_default_media.client() as client:
        median_latency(client, NORMAL, 2)
        return median_latency(client, NORMAL, 7)


PNG = encode(make_image(40, 30, 5))
HOSTILE_IMAGES = {
    "a PNG that claims 100000x100000 pixels": (data_url(bomb_png(100_000, 100_000)), 400, "pixels"),
    "a truncated JPEG": (data_url(encode(make_image(64, 64, 6), "JPEG")[:300], "image/jpeg"), 400, "image"),
    "a ZIP renamed .png": (data_url(b"PK\x03\x04\x14\x00\x00\x00\x08\x00" + os.urandom(200)), 400, "not an image"),
    "an empty image": ("data:image/png;base64,", 400, "empty"),
    "the cloud metadata service": ("http://169.254.169.254/latest/meta-data/iam/", 400, "not a public address"),
    "loopback": ("http://127.0.0.1:9/cat.png", 400, "not a public address"),
    "localhost by name": ("http://localhost/cat.png", 400, "not a public address"),
    "loopback as a decimal number": ("http://2130706433/cat.png", 400, "not a public address"),
    "IPv6 loopback": ("http://[::1]/cat.png", 400, "not a public address"),
    "a private network": ("http://10.0.0.1/cat.png", 400, "not a public address"),
    # IPv6 addresses that carry an IPv4 address (Python's ipaddress counts the first and fourth as global).
    "IPv4-compatible loopback": ("http://[::127.0.0.1]:9/cat.png", 400, "not a public address"),
    "IPv4-mapped loopback": ("http://[::ffff:127.0.0.1]:9/cat.png", 400, "not a public address"),
    "NAT64 metadata": ("http://[64:ff9b::169.254.169.254]/latest/", 400, "not a public address"),
    "local-use NAT64 loopback": ("http://[64:ff9b:1::7f00:1]:9/cat.png", 400, "not a public address"),
    "6to4 loopback": ("http://[2002:7f00:1::1]:9/cat.png", 400, "not a public address"),
    "Teredo": ("http://[2001:0:4136:e378:8000:63bf:80ff:fffe]/cat.png", 400, "not a public address"),
    "a 1x5000 PNG": (data_url(encode(Image.new("L", (1, 5000)))), 400, "an aspect ratio of 5000:1"),
    "a file URL": ("file:///etc/passwd", 400, "not allowed"),
}


@pytest.mark.parametrize("case", list(HOSTILE_IMAGES))
def test_hostile_images_get_a_4xx_and_the_server_stays_as_fast(
    clip_default_media: InProcessServer, clip_baseline: float, case: str
) -> None:
    source, status, says = HOSTILE_IMAGES[case]
    with clip_default_media.client() as client:
        started = time.perf_counter()
        response = client.post("/v1/embeddings", json={"input": [{"image": source}]})
        assert response.status_code == status, response.text
        assert says in response.json()["error"]["message"]
        assert response.json()["error"]["param"] == "input[0].image"
        assert time.perf_counter() - started < 3
        assert_as_fast_as_before(client, clip_baseline)


def test_more_images_than_the_limit_are_refused_before_any_is_decoded(clip_default_media: InProcessServer) -> None:
    with clip_default_media.client() as client:
        images = [{"image": data_url(PNG)}] * IMAGE_LIMIT
        assert client.post("/v1/embeddings", json={"input": images}).status_code == 200
        over = client.post("/v1/embeddings", json={"input": [*images, {"image": "http://10.0.0.1/x.png"}]})
        assert over.status_code == 400
        assert over.json()["error"]["code"] == "too_many_images"
        assert f"limit of {IMAGE_LIMIT} per request (--max-images-per-request)" in over.json()["error"]["message"]


# CORS ------------------------------------------------------------------------------------------------


def preflight(client: httpx.Client, origin: str) -> httpx.Response:
    headers = {
        "origin": origin,
        "access-control-request-method": "POST",
        "access-control-request-headers": "authorization, content-type",
    }
    return client.options("/v1/embeddings", headers=headers)


def test_cors_answers_the_allowed_origin_only(guarded: InProcessServer) -> None:
    with guarded.client() as client:
        allowed = preflight(client, ORIGIN)
        assert allowed.status_code == 200
        assert allowed.headers["access-control-allow-origin"] == ORIGIN
        assert "authorization" in allowed.headers["access-control-allow-headers"].lower()
        assert "access-control-allow-credentials" not in allowed.headers
        refused = preflight(client, "https://evil.example.com")
        assert refused.status_code == 400
        assert "access-control-allow-origin" not in refused.headers
        simple = client.post("/v1/embeddings", json={"input": "hi"}, headers={**bearer(), "origin": ORIGIN})
        assert simple.headers["access-control-allow-origin"] == ORIGIN
        other = client.post(
            "/v1/embeddings", json={"input": "hi"}, headers={**bearer(), "origin": "https://evil.example.com"}
        )
        assert "access-control-allow-origin" not in other.headers


def test_cors_is_off_by_default(server: InProcessServer) -> None:
    with server.client() as client:
        response = preflight(client, ORIGIN)
        assert response.status_code == 405
        assert "access-control-allow-origin" not in response.headers
        simple = client.post("/v1/embeddings", json={"input": "hi"}, headers={"origin": ORIGIN})
        assert "access-control-allow-origin" not in simple.headers
