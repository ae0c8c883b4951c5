"""Hostile input and access on live `launch` processes: the key kept out of the processes, body and header limits on
connections made by hand, big texts and an API server's event loop, the engine socket, the engine's cache across a
restart (the rest, in one process: tests/in_process/test_security.py)."""

from __future__ import annotations

import contextlib
import gc
import itertools
import os
import re
import select
import signal
import socket
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import msgspec
import numpy as np
import numpy.typing as npt
import pytest
import zmq

from apiserver.connection.auth import OPEN_PATHS
from bench.harness.server_process import PoolserveProcess, cmdline, memory_mb, role_of, wait_until
from poolserve.config import BUNDLED_MODEL_NAME
from poolserve.protocol import Abort, ClientWire, EngineRequest, Outputs, Ping, Pong, PoolingParams
from tests.conftest import (
    API_KEY,
    CORS_ORIGIN,
    GUARDED_BODIES_IN_FLIGHT,
    GUARDED_BODY_LIMIT,
    GUARDED_CACHE_BYTES,
    GUARDED_TOKEN_LIMIT,
)
from tests.utils import is_alive, ready_line_time, runtime_dirs_of, socket_inodes

KEY, ORIGIN, BODY_LIMIT, TOKEN_LIMIT = API_KEY, CORS_ORIGIN, GUARDED_BODY_LIMIT, GUARDED_TOKEN_LIMIT
NORMAL = {"input": ["a normal sentence about the weather in spring"]}
JSON = {"content-type": "application/json"}


@pytest.fixture(scope="module")
def guarded(guarded_server: PoolserveProcess) -> PoolserveProcess:
    return guarded_server


def bearer(key: str = KEY) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"}


# API key ---------------------------------------------------------------------------------------------


def test_probes_stay_open_without_a_key_and_protected_metrics_need_it(guarded: PoolserveProcess) -> None:
    # Kubernetes' liveness and readiness probes carry no credentials: a 401 there restarts a healthy pod. The
    # server runs with --protect-metrics beside its key (tests/conftest.py): the engine's keyless copy of the
    # config once kept --protect-metrics and failed to validate, so that it started at all is half the test.
    # /metrics open without --protect-metrics: tests/in_process/test_security.py.
    assert {"/health", "/health/ready", "/health/live", "/ping"} <= OPEN_PATHS
    with guarded.client() as client:
        for path in OPEN_PATHS:
            response = client.get(path)
            assert response.status_code == 200, (path, response.text)
            assert response.json()["status"] == "ok", path
        assert client.get("/metrics").status_code == 401
        assert client.get("/metrics", headers=bearer("wrong")).status_code == 401
        metrics = client.get("/metrics", headers=bearer())
        assert metrics.status_code == 200
        assert "# TYPE poolserve_" in metrics.text
    # It names the model as clients do, not by the folder it was loaded from (it is open to anyone by default).
    (info,) = [line for line in metrics.text.splitlines() if line.startswith("poolserve_model_info{")]
    assert f'model_name="{BUNDLED_MODEL_NAME}"' in info and "path=" not in info and '"/' not in info


def test_the_key_is_in_no_command_line_no_log_and_not_in_the_engine(guarded: PoolserveProcess) -> None:
    with guarded.client() as client:
        assert client.post("/v1/embeddings", json={"input": "hi"}, headers=bearer()).status_code == 200
        assert client.post("/v1/embeddings", json={"input": "hi"}, headers=bearer("wrong")).status_code == 401
    processes = [guarded.pid, *guarded.children()]
    assert sorted(role_of(cmdline(pid)) for pid in processes) == [
        "apiserver",
        "engine",
        "engine-template",
        "supervisor",
    ]
    for pid in processes:
        assert KEY not in cmdline(pid)
    everyone = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True, check=True).stdout
    assert KEY not in everyone
    assert KEY not in guarded.log()
    # The engine, and the template it was forked from (engine_core/template.py), never had it in their environment.
    for pid in (*guarded.child_pid("engine_core"), *guarded.child_pid("engine_core.template")):
        assert KEY.encode() not in Path(f"/proc/{pid}/environ").read_bytes()


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


def test_a_body_declared_over_the_limit_is_a_413_before_it_is_sent(guarded: PoolserveProcess) -> None:
    head = (
        f"POST /v1/embeddings HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {KEY}\r\n"
        f"content-type: application/json\r\ncontent-length: {10_000_000}\r\n\r\n"
    ).encode()
    started = time.perf_counter()
    status, body = post_raw(guarded.port, head, iter([b"{"]))
    assert status == 413
    assert f"limit of {BODY_LIMIT} bytes (--max-request-bytes)".encode() in body
    assert time.perf_counter() - started < 2


def test_a_chunked_body_is_refused_once_it_passes_the_limit(guarded: PoolserveProcess) -> None:
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


def test_held_uploads_fill_the_bodies_in_flight_and_the_next_gets_503_before_its_body(
    guarded: PoolserveProcess,
) -> None:
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
            metrics = client.get("/metrics", headers=bearer()).text
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
def test_headers_past_the_bound_get_431_and_the_connection_is_closed(server: PoolserveProcess, size: int) -> None:
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
    server: PoolserveProcess, head: bytes, status: int
) -> None:
    # RFC 9112 3.2; uvicorn once answered these 200.
    answer = exchange(server.port, head)
    assert answer.startswith(b"HTTP/1.1 %d " % status), answer
    if status == 400:
        assert b"invalid_host" in answer and b"connection: close" in answer.lower()
    with server.client() as client:
        assert client.get("/health").status_code == 200


def test_the_key_is_checked_before_a_large_body_is_read(guarded: PoolserveProcess) -> None:
    head = b"POST /v1/embeddings HTTP/1.1\r\nhost: x\r\ncontent-length: 10000000\r\n\r\n"
    assert post_raw(guarded.port, head, iter([b"{"]))[0] == 401


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
def client_on(server: PoolserveProcess, index: str) -> Iterator[httpx.Client]:
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


@pytest.mark.alone
@pytest.mark.parametrize("case", list(BIG_REQUESTS))
def test_a_big_text_never_holds_the_event_loop_of_its_api_server(server: PoolserveProcess, case: str) -> None:
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
            # The server's pauses are timed, not this process's: a collection of the suite's heap here took up to
            # 0.8 s before tests/conftest.py settled it, and one of what tests built since takes up to ~0.19 s.
            gc.disable()
            try:
                sending.start()
                while sending.is_alive():
                    started = time.perf_counter()
                    assert prober.get("/health/live").status_code == 200
                    worst = max(worst, time.perf_counter() - started)
                    time.sleep(0.005)
                sending.join()
            finally:
                gc.enable()
    assert results[0].status_code == status, results[0].text[:300]
    assert worst < 0.1, f"/health/live took {worst * 1000:.0f} ms on the API server tokenizing {case}"


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


def test_nothing_listens_on_tcp_but_the_http_socket_on_loopback(server: PoolserveProcess) -> None:
    assert "beyond loopback" not in server.stdout()
    pids = [server.pid, *server.children()]
    everything = listening_sockets(set().union(*(socket_inodes(pid) for pid in pids)))
    listening = [entry for entry in everything if entry[0].endswith(":0A") or entry[0].startswith("udp")]
    # 0100007F is 127.0.0.1 as /proc/net/tcp writes it.
    assert listening == [("tcp:0A", server.port, "0100007F")]
    (engine,) = server.child_pid("engine_core")
    assert listening_sockets(socket_inodes(engine)) == []


def test_the_engine_socket_lives_in_a_folder_only_its_user_can_enter(server: PoolserveProcess) -> None:
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


def test_garbage_on_the_engine_socket_is_dropped_and_the_engine_keeps_serving(server: PoolserveProcess) -> None:
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


def test_a_repeated_input_is_answered_from_the_cache_with_the_rows_it_computed(guarded: PoolserveProcess) -> None:
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
