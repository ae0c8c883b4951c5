"""Hostile input and access on live servers: keys, limits, hostile bodies and images, SSRF, CORS, the engine socket."""

from __future__ import annotations

import contextlib
import itertools
import os
import re
import select
import signal
import socket
import statistics
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import msgspec
import numpy as np
import numpy.typing as npt
import pytest
import zmq
from PIL import Image

from apiserver.auth import OPEN_PATHS
from apiserver.endpoints import ENDPOINTS
from bench.server_process import cmdline, memory_mb, wait_until
from poolserve.config import API_KEY_ENV, BUNDLED_MODEL_NAME
from poolserve.protocol import Abort, ClientWire, EngineRequest, Outputs, Ping, Pong, PoolingParams
from tests.conftest import (
    API_KEY,
    CORS_ORIGIN,
    GUARDED_BODIES_IN_FLIGHT,
    GUARDED_BODY_LIMIT,
    GUARDED_CACHE_BYTES,
    GUARDED_TOKEN_LIMIT,
)
from tests.images import bomb_png, data_url, encode, make_image
from tests.utils import LaunchedServer, is_alive, ready_line_time, runtime_dirs_of, socket_inodes

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
def guarded(guarded_server: LaunchedServer) -> LaunchedServer:
    return guarded_server


@pytest.fixture(scope="module")
def clip_default_media(clip_model: Path) -> Iterator[LaunchedServer]:
    """A CLIP-style model with the default media policy: public URLs only."""
    launched = LaunchedServer(
        "--model", str(clip_model), "--api-server-count", "1", "--max-images-per-request", str(IMAGE_LIMIT),
        "--image-fetch-timeout", "2",
    )  # fmt: skip
    try:
        yield launched.wait_ready()
    finally:
        launched.stop()


def bearer(key: str = KEY) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"}


# API key ---------------------------------------------------------------------------------------------


def test_every_model_endpoint_refuses_a_missing_or_wrong_key_and_accepts_the_right_one(
    guarded: LaunchedServer,
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


def test_probes_and_metrics_stay_open_without_a_key(guarded: LaunchedServer) -> None:
    # Kubernetes' liveness and readiness probes carry no credentials: a 401 there restarts a healthy pod.
    assert {"/health", "/health/ready", "/health/live", "/ping"} <= OPEN_PATHS
    with guarded.client() as client:
        for path in OPEN_PATHS:
            response = client.get(path)
            assert response.status_code == 200, (path, response.text)
            assert response.json()["status"] == "ok", path
        metrics = client.get("/metrics")
        assert metrics.status_code == 200
    # Open to anyone, so it names the model as clients do, not by the folder it was loaded from.
    (info,) = [line for line in metrics.text.splitlines() if line.startswith("poolserve_model_info{")]
    assert f'model_name="{BUNDLED_MODEL_NAME}"' in info and "path=" not in info and '"/' not in info


def test_a_key_and_protect_metrics_start_together_and_metrics_then_needs_the_key() -> None:
    # The engine's keyless copy of the config once kept --protect-metrics and failed to validate.
    launched = LaunchedServer("--api-server-count", "1", "--protect-metrics", env={API_KEY_ENV: KEY})
    try:
        launched.wait_ready()
        with launched.client() as client:
            assert client.get("/metrics").status_code == 401
            assert client.get("/metrics", headers=bearer("wrong")).status_code == 401
            response = client.get("/metrics", headers=bearer())
            assert response.status_code == 200
            assert "# TYPE poolserve_" in response.text
            assert client.get("/health").status_code == 200
    finally:
        launched.stop()


def test_the_key_is_in_no_command_line_no_log_and_not_in_the_engine(guarded: LaunchedServer) -> None:
    with guarded.client() as client:
        assert client.post("/v1/embeddings", json={"input": "hi"}, headers=bearer()).status_code == 200
        assert client.post("/v1/embeddings", json={"input": "hi"}, headers=bearer("wrong")).status_code == 401
    processes = [guarded.pid, *guarded.children()]
    assert len(processes) == 3
    for pid in processes:
        assert KEY not in cmdline(pid)
    everyone = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True, check=True).stdout
    assert KEY not in everyone
    assert KEY not in guarded.log()
    (engine,) = guarded.child_pid("engine_core")
    assert KEY.encode() not in Path(f"/proc/{engine}/environ").read_bytes()


# limits ----------------------------------------------------------------------------------------------


def post_raw(port: int, head: bytes, chunks: Iterator[bytes]) -> tuple[int, bytes]:
    """Send a request by hand, body chunk by chunk until the server answers or hangs up; its status and body."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as conn:
        conn.sendall(head)
        for chunk in chunks:
            if select.select([conn], [], [], 0)[0]:  # an answer already: stop sending
                break
            try:
                conn.sendall(chunk)
            except OSError:  # the server answered and closed: read what it said
                break
        answer = b""
        while b"\r\n\r\n" not in answer and (data := conn.recv(65536)):
            answer += data
        head_part, _, body = answer.partition(b"\r\n\r\n")
        length = int(re.search(rb"content-length: (\d+)", head_part, re.IGNORECASE)[1])  # type: ignore[index]
        while len(body) < length and (data := conn.recv(65536)):
            body += data
    return int(head_part.split(b" ", 2)[1]), body


def test_a_body_declared_over_the_limit_is_a_413_before_it_is_sent(guarded: LaunchedServer) -> None:
    head = (
        f"POST /v1/embeddings HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {KEY}\r\n"
        f"content-type: application/json\r\ncontent-length: {10_000_000}\r\n\r\n"
    ).encode()
    started = time.perf_counter()
    status, body = post_raw(guarded.port, head, iter([b"{"]))
    assert status == 413
    assert f"limit of {BODY_LIMIT} bytes (--max-request-bytes)".encode() in body
    assert time.perf_counter() - started < 2


def test_a_chunked_body_is_refused_once_it_passes_the_limit(guarded: LaunchedServer) -> None:
    head = (
        f"POST /v1/embeddings HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {KEY}\r\n"
        "content-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n"
    ).encode()
    piece = b" " * 65536
    chunks = iter([b"%x\r\n%s\r\n" % (len(piece), piece)] * (10_000_000 // len(piece)))
    status, body = post_raw(guarded.port, head, chunks)
    assert status == 413, body
    assert b"request_too_large" in body


def upload_head(length: int) -> bytes:
    return (
        f"POST /v1/embeddings HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {KEY}\r\n"
        f"content-type: application/json\r\ncontent-length: {length}\r\n\r\n"
    ).encode()


def test_held_uploads_fill_the_bodies_in_flight_and_the_next_gets_503_before_its_body(guarded: LaunchedServer) -> None:
    # Issue 16: 20 uploads of 31 MB each, all but the last byte sent, held +616 MB until their clients closed.
    (api,) = guarded.child_pid("apiserver")
    held = [socket.create_connection(("127.0.0.1", guarded.port), timeout=30) for _ in range(3)]
    try:
        before = memory_mb(api)["rss_mb"]
        for conn in held:
            conn.sendall(upload_head(GUARDED_BODY_LIMIT) + b" " * (GUARDED_BODY_LIMIT - 1))
        assert 3 * GUARDED_BODY_LIMIT == GUARDED_BODIES_IN_FLIGHT
        for _ in range(5):  # more uploads, each answered at once without a byte of its body read
            started = time.perf_counter()
            status, body = post_raw(guarded.port, upload_head(GUARDED_BODY_LIMIT), iter([]))
            assert status == 503, body
            assert time.perf_counter() - started < 2
            error = msgspec.json.decode(body)["error"]
            assert error["code"] == "too_many_uploads" and "--max-body-bytes-in-flight" in error["message"]
        grown = memory_mb(api)["rss_mb"] - before
        assert grown < GUARDED_BODIES_IN_FLIGHT / 1e6 + 40, grown  # what was let in, not what was refused
        with guarded.client() as client:
            assert client.post("/v1/embeddings", json=NORMAL, headers=bearer()).headers["retry-after"] == "1"
            metrics = client.get("/metrics").text
        assert re.search(r'poolserve_request_bodies_refused_total\{server="0"\} ([6-9]|\d\d)', metrics), metrics
    finally:
        for conn in held:
            conn.close()
    with guarded.client() as client:  # the held bytes come back when their requests end
        assert wait_until(
            lambda: client.post("/v1/embeddings", json=NORMAL, headers=bearer()).status_code == 200, 10, interval=0.05
        ), guarded.tail()
    payload = msgspec.json.encode(NORMAL) + b" " * (GUARDED_BODY_LIMIT - 100)  # a large body, cheap to parse
    status, body = post_raw(guarded.port, upload_head(len(payload)), iter([payload]))
    assert status == 200, body


@pytest.mark.parametrize("size", [1_000_000, 50_000_000])
def test_headers_past_the_bound_get_431_and_the_connection_is_closed(server: LaunchedServer, size: int) -> None:
    head = b"GET /health HTTP/1.1\r\nhost: x\r\nx-padding: "
    chunks = iter([b"a" * 65536] * (size // 65536) + [b"\r\n\r\n"])
    status, body = post_raw(server.port, head, chunks)
    assert status == 431
    assert b"headers_too_large" in body
    with server.client() as client:
        assert client.get("/health", headers={"x-padding": "a" * 8000}).status_code == 200


def exchange(port: int, request: bytes) -> bytes:
    """Send one request by hand and read until the server closes the connection (10 s at most)."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as conn:
        conn.sendall(request)
        received = b""
        while chunk := conn.recv(65536):
            received += chunk
            if b"connection: keep-alive" in received.lower() and received.endswith(b"}"):
                break  # a keep-alive answer: the server would wait for the next request
        return received


@pytest.mark.parametrize(
    ("head", "status"),
    [
        (b"GET /health HTTP/1.1\r\n\r\n", 400),
        (b"GET /health HTTP/1.1\r\nhost: a\r\nhost: b\r\n\r\n", 400),
        (b"GET /health HTTP/1.1\r\nhost: a\r\nHost: a\r\n\r\n", 400),
        (b'POST /v1/embeddings HTTP/1.1\r\ncontent-length: 14\r\n\r\n{"input":"hi"}', 400),
        (b"GET /health HTTP/1.0\r\n\r\n", 200),  # HTTP/1.0 may leave Host out
        (b"GET /health HTTP/1.1\r\nhost: a\r\nconnection: close\r\n\r\n", 200),
    ],
)
def test_an_http11_request_without_exactly_one_host_header_gets_400(
    server: LaunchedServer, head: bytes, status: int
) -> None:
    # RFC 9112 3.2; uvicorn once answered these 200.
    answer = exchange(server.port, head)
    assert answer.startswith(b"HTTP/1.1 %d " % status), answer
    if status == 400:
        assert b"invalid_host" in answer and b"connection: close" in answer.lower()
    with server.client() as client:
        assert client.get("/health").status_code == 200


def test_the_key_is_checked_before_a_large_body_is_read(guarded: LaunchedServer) -> None:
    head = b"POST /v1/embeddings HTTP/1.1\r\nhost: x\r\ncontent-length: 10000000\r\n\r\n"
    assert post_raw(guarded.port, head, iter([b"{"]))[0] == 401


def test_too_many_tokens_in_one_request_is_a_400_naming_the_limit(guarded: LaunchedServer) -> None:
    with guarded.client(headers=bearer()) as client:
        over = client.post("/v1/embeddings", json={"input": ["word " * 60] * 40})
        assert over.status_code == 400
        assert over.json()["error"]["code"] == "too_many_tokens"
        assert f"limit of {TOKEN_LIMIT} per request (--max-tokens-per-request)" in over.json()["error"]["message"]
        assert client.post("/v1/embeddings", json={"input": ["word " * 60] * 20}).status_code == 200
        # Counted after truncation: what the model would run on.
        cut = {"input": ["word " * 300] * 30, "truncate_prompt_tokens": 50}
        assert client.post("/v1/embeddings", json=cut).status_code == 200


# big texts: the API server's event loop stays free --------------------------------------------------

# Just under the default 4 MiB body of a text-only model: over 800k tokens, 3 s to tokenize whole.
BIG_TEXT = " ".join(itertools.islice(itertools.cycle(["alpha", "beta", "gamma", "delta", "kappa"]), 700_000))
BIG_REQUESTS = {
    "/tokenize prompt": ("/tokenize", {"prompt": BIG_TEXT}, 400),
    "/tokenize inputs": ("/tokenize", {"inputs": [BIG_TEXT]}, 413),  # TEI's body: TEI's status
    "embeddings, truncated": ("/v1/embeddings", {"input": BIG_TEXT, "truncate_prompt_tokens": -1}, 200),
    "embeddings, refused": ("/v1/embeddings", {"input": BIG_TEXT}, 400),
    "TEI embed, left truncated": (
        "/embed",
        {"inputs": BIG_TEXT, "truncate": True, "truncation_direction": "left"},
        200,
    ),
    "rerank, truncated": ("/rerank", {"query": BIG_TEXT[::2], "texts": [BIG_TEXT[1::2]], "truncate": True}, 200),
}


@contextlib.contextmanager
def client_on(server: LaunchedServer, index: str) -> Iterator[httpx.Client]:
    """A keep-alive client whose one connection landed on API server `index`. Fair accept sends each
    new connection to the server holding fewest, so those that land elsewhere stay open meanwhile."""
    elsewhere = []
    try:
        for _ in range(8):
            client = server.client(limits=httpx.Limits(max_connections=1))
            elsewhere.append(client)
            if client.get("/health/live").headers["x-poolserve-server"] == index:
                yield client
                return
        raise AssertionError(f"no connection landed on API server {index}")
    finally:
        for client in elsewhere:
            client.close()


@pytest.mark.parametrize("case", list(BIG_REQUESTS))
def test_a_big_text_never_holds_the_event_loop_of_its_api_server(server: LaunchedServer, case: str) -> None:
    # Once a 30 MB text held an API server's GIL until the supervisor killed it (3 s per 3 MB).
    path, body, status = BIG_REQUESTS[case]
    content = msgspec.json.encode(body)  # before probing: encoding it here would hold this process's GIL
    assert len(content) < 4 * 1024 * 1024
    with server.client(limits=httpx.Limits(max_connections=1)) as sender:
        index = sender.get("/health/live").headers["x-poolserve-server"]
        with client_on(server, index) as prober:
            sending = threading.Thread(
                target=lambda: results.append(sender.post(path, content=content, headers=JSON)), daemon=True
            )
            results: list[httpx.Response] = []
            worst = 0.0
            sending.start()
            while sending.is_alive():
                started = time.perf_counter()
                assert prober.get("/health/live").status_code == 200
                worst = max(worst, time.perf_counter() - started)
                time.sleep(0.005)
            sending.join()
    assert results[0].status_code == status, results[0].text[:300]
    assert worst < 0.1, f"/health/live took {worst * 1000:.0f} ms on the API server tokenizing {case}"


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
def text_baseline(server: LaunchedServer) -> float:
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
    server: LaunchedServer, text_baseline: float, case: str
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


def test_a_token_id_past_the_vocabulary_is_refused_by_every_endpoint_that_takes_ids(server: LaunchedServer) -> None:
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


def test_a_wrong_method_is_a_405_that_says_which_are_allowed(server: LaunchedServer) -> None:
    with server.client() as client:
        response = client.get("/v1/embeddings")
        assert response.status_code == 405
        assert response.headers["allow"] == "POST"
        assert set(client.delete("/health").headers["allow"].split(", ")) == {"GET", "HEAD"}


# hostile images, and where image URLs may lead --------------------------------------------------------


@pytest.fixture(scope="module")
def clip_baseline(clip_default_media: LaunchedServer) -> float:
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
    clip_default_media: LaunchedServer, clip_baseline: float, case: str
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


def test_more_images_than_the_limit_are_refused_before_any_is_decoded(clip_default_media: LaunchedServer) -> None:
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


def test_cors_answers_the_allowed_origin_only(guarded: LaunchedServer) -> None:
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


def test_cors_is_off_by_default(server: LaunchedServer) -> None:
    with server.client() as client:
        response = preflight(client, ORIGIN)
        assert response.status_code == 405
        assert "access-control-allow-origin" not in response.headers
        simple = client.post("/v1/embeddings", json={"input": "hi"}, headers={"origin": ORIGIN})
        assert "access-control-allow-origin" not in simple.headers


# sockets: only the HTTP port on TCP, the engine's socket in a private folder -----------------------------


def listening_sockets(inodes: set[str]) -> list[tuple[str, int, str]]:
    """(file, port, local address) of the TCP and UDP sockets among `inodes`, in every state."""
    found = []
    for name in ("tcp", "tcp6", "udp", "udp6"):
        for line in Path(f"/proc/net/{name}").read_text().splitlines()[1:]:
            fields = line.split()
            if fields[9] in inodes:
                address, port = fields[1].split(":")
                found.append((f"{name}:{fields[3]}", int(port, 16), address))
    return found


def test_nothing_listens_on_tcp_but_the_http_socket_on_loopback(server: LaunchedServer) -> None:
    assert "beyond loopback" not in server.stdout()
    pids = [server.pid, *server.children()]
    everything = listening_sockets(set().union(*(socket_inodes(pid) for pid in pids)))
    listening = [entry for entry in everything if entry[0].endswith(":0A") or entry[0].startswith("udp")]
    # 0100007F is 127.0.0.1 as /proc/net/tcp writes it.
    assert listening == [("tcp:0A", server.port, "0100007F")]
    (engine,) = server.child_pid("engine_core")
    assert listening_sockets(socket_inodes(engine)) == []


def test_the_engine_socket_lives_in_a_folder_only_its_user_can_enter(server: LaunchedServer) -> None:
    (engine,) = server.child_pid("engine_core")
    (folder,) = runtime_dirs_of(engine)
    info = os.stat(folder)
    assert info.st_mode & 0o777 == 0o700
    assert info.st_uid == os.getuid()
    assert sorted(os.listdir(folder)) == ["engine-flight", "engine.sock", "metrics"]
    metrics = os.stat(os.path.join(folder, "metrics"))
    assert metrics.st_mode & 0o777 == 0o700 and metrics.st_uid == os.getuid()


# garbage to the engine's socket ----------------------------------------------------------------------


def tokens(*ids: int) -> bytes:
    return np.asarray(ids, dtype="<i4").tobytes()


def ids(*values: int) -> npt.NDArray[np.int32]:
    return np.asarray(values, dtype=np.int32)


def sent(request: EngineRequest, *data: bytes) -> list[bytes]:
    """The request's header as an API server encodes it, followed by `data` frames (or by its own, when none)."""
    frames = [bytes(frame) for frame in ClientWire().encode(request)]
    return [frames[0], *data] if data else frames


def test_garbage_on_the_engine_socket_is_dropped_and_the_engine_keeps_serving(server: LaunchedServer) -> None:
    (engine,) = server.child_pid("engine_core")
    (folder,) = runtime_dirs_of(engine)
    with server.client() as client:
        before = client.post("/v1/embeddings", json=NORMAL).json()["data"][0]["embedding"]
    wire = ClientWire()
    encode_msg = msgspec.msgpack.encode
    garbage: list[list[bytes]] = [
        [os.urandom(64)],
        [b""],
        [os.urandom(16) for _ in range(7)],
        [os.urandom(4 * 1024 * 1024)],
        [msgspec.msgpack.encode({"a": 1})],
        [msgspec.msgpack.encode(["pool", "x"])],
        [msgspec.msgpack.encode(["nope", 1])],
        [msgspec.msgpack.encode(12345)],
        [msgspec.msgpack.encode(["hello", "x", "y"])],
        [encode_msg(Abort([0, 1, 2, 3, 4, 5]))],  # ids of other peers' requests: keyed by sender, no effect
    ]
    # Requests that cannot run: each gets an error reply, never a batch.
    refused = {
        71: sent(EngineRequest(id=71, lengths=[3], tokens=ids(101, 102, 103)), tokens(101, 102)),
        72: sent(EngineRequest(id=72, lengths=[2], tokens=ids(101, 102)))[:1],
        73: sent(EngineRequest(id=73, lengths=[2], tokens=ids(101, 99999))),
        74: sent(EngineRequest(id=74, lengths=[2**64 - 1], tokens=ids(101))),
        75: sent(EngineRequest(id=75, lengths=[1], tokens=ids(101), pixels=np.zeros((1, 2, 2, 3), dtype=np.uint8))),
        76: sent(EngineRequest(id=76, lengths=[2], tokens=ids(101, 102), token_types=ids(0, 7))),
        77: sent(EngineRequest(id=77, lengths=[1], tokens=ids(101), params=PoolingParams(dimensions=-3))),
        # Headers with a field of the wrong type: undecodable, yet their id is readable, so they are answered.
        78: [encode_msg(["pool", 78, ["not", "ints"]]), tokens(101)],
        79: [encode_msg(["pool", 79, [1], [1, 1], None, None, [0, 1]]), tokens(101)],  # normalize: a bool or nil, not 1
    }
    context = zmq.Context()
    dealer = context.socket(zmq.DEALER)
    dealer.setsockopt(zmq.LINGER, 0)
    dealer.setsockopt(zmq.RCVTIMEO, 10_000)
    try:
        dealer.connect(f"ipc://{folder}/engine.sock")
        for frames in [*garbage, *refused.values()]:
            dealer.send_multipart(frames)
        dealer.send_multipart(wire.encode(Ping(4242)))
        errors: dict[int, str] = {}
        while True:
            reply = wire.decode(dealer.recv_multipart())
            if isinstance(reply, Pong):
                assert reply.nonce == 4242
                break
            assert isinstance(reply, Outputs) and not reply.outputs
            errors.update({failure.id: failure.message for failure in reply.failures})
        assert set(errors) == set(refused)
        assert all(error.startswith("invalid request") for error in errors.values())
    finally:
        dealer.close()
        context.term()
    assert is_alive(engine)
    with server.client() as client:
        after = client.post("/v1/embeddings", json=NORMAL).json()["data"][0]["embedding"]
        assert client.get("/health").status_code == 200
    assert np.allclose(before, after, atol=1e-6)
    assert "dropped" in server.stderr()


# the engine's cache -----------------------------------------------------------------------------------


def cache_metric(client: httpx.Client, name: str) -> float:
    text = client.get("/metrics").text
    return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith(f"poolserve_cache_{name}"))


def test_a_repeated_input_is_answered_from_the_cache_with_the_rows_it_computed(guarded: LaunchedServer) -> None:
    texts = [f"cache test {uuid.uuid4().hex} number {i}" for i in range(3)]
    with guarded.client(headers=bearer()) as client:
        hits_before = cache_metric(client, "hits_total")
        first = client.post("/v1/embeddings", json={"input": texts})
        assert first.headers["x-cache-hits"] == "0"
        again = client.post("/v1/embeddings", json={"input": [texts[1], "a new one " + texts[0], texts[2]]})
        assert again.headers["x-cache-hits"] == "2"
        assert cache_metric(client, "hits_total") - hits_before == 2
        computed = [item["embedding"] for item in first.json()["data"]]
        cached = [item["embedding"] for item in again.json()["data"]]
        np.testing.assert_allclose(cached[0], computed[1], atol=1e-6)
        np.testing.assert_allclose(cached[2], computed[2], atol=1e-6)
        # Another `dimensions` or `normalize` finishes the same cached row its own way.
        short = client.post("/v1/embeddings", json={"input": texts[1], "dimensions": 8, "normalize": False})
        assert short.headers["x-cache-hits"] == "1"
        raw = client.post("/pooling", json={"input": texts[1], "normalize": False}).json()["data"][0]["data"]
        np.testing.assert_allclose(short.json()["data"][0]["embedding"], raw[:8], atol=1e-6)
        # A stream of distinct inputs: the cache stays within its bytes (20 rows here), evicting the oldest.
        for i in range(30):
            client.post("/v1/embeddings", json={"input": f"distinct {uuid.uuid4().hex} {i}"})
        assert 0 < cache_metric(client, "bytes") <= GUARDED_CACHE_BYTES
        assert cache_metric(client, "evictions_total") >= 10
        assert client.post("/v1/embeddings", json={"input": texts[0]}).headers["x-cache-hits"] == "0"
        # The cache lives in the engine: a restarted engine starts empty, and computes the same rows again.
        assert client.post("/v1/embeddings", json={"input": texts[0]}).headers["x-cache-hits"] == "1"
        (engine,) = guarded.child_pid("engine_core")
        os.kill(engine, signal.SIGKILL)
        ready_line_time(guarded, "engine", engine, timeout=60)
        after = client.post("/v1/embeddings", json={"input": texts[0]})
        assert after.headers["x-cache-hits"] == "0"
        np.testing.assert_allclose(after.json()["data"][0]["embedding"], computed[0], atol=1e-6)
