"""Slow and surplus connections on the API server of `launch` (stack_server.py: its GatedServer, HTTP protocol and
connection policy): header and body timeouts, and the per-server connection limit (each client address's share of a
server's connections: test_connections.py). A full server leaving connections to a sibling with room, and the 503 once
every server is full: tests/apiserver/connection/test_fair_accept.py."""

from __future__ import annotations

import contextlib
import http.client
import logging
import re
import socket
import time
import urllib.request
from collections import Counter
from collections.abc import Iterator

import msgspec
import pytest

from bench.harness.server_process import wait_until
from tests.in_process.stack_server import InProcessServer, served

TIMEOUT_S = 1.5
LIMIT = 4
BODY = msgspec.json.encode({"input": "a request sent slowly but in time"})


@pytest.fixture(scope="module")
def server() -> Iterator[InProcessServer]:
    """`launch`'s flags as they were; with --max-connections-per-client at the server's whole limit, since here loopback
    is no trusted proxy (stack_server.py) and would otherwise hold a quarter of it, as under `launch` it does not."""
    with served(
        "--max-connections-per-server", str(LIMIT), "--max-connections-per-client", str(LIMIT),
        "--header-timeout", str(TIMEOUT_S), "--body-timeout", str(TIMEOUT_S),
    ) as started:  # fmt: skip
        yield started


@pytest.fixture
def logged(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    """The API server's log lines (and uvicorn's) while the test runs: the server logs in this process."""
    caplog.set_level(logging.INFO, logger="poolserve.api")  # uvicorn's warnings reach it at the root's level
    return caplog


@contextlib.contextmanager
def raw_connection(server: InProcessServer) -> Iterator[socket.socket]:
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=10)
    try:
        yield sock
    finally:
        sock.close()


def read_until_closed(sock: socket.socket) -> tuple[bytes, float]:
    """Everything the server sends until it closes, and when it closed (monotonic)."""
    received = b""
    with contextlib.suppress(ConnectionResetError):
        while chunk := sock.recv(65536):
            received += chunk
    return received, time.monotonic()


def error_code(answer: bytes) -> str:
    code: str = msgspec.json.decode(answer.split(b"\r\n\r\n", 1)[1])["error"]["code"]
    return code


def metric_values(server: InProcessServer, name: str) -> dict[str, float]:
    with urllib.request.urlopen(server.url + "/metrics", timeout=10) as response:
        text = response.read().decode()
    return {labels: float(value) for labels, value in re.findall(rf"^{name}\{{([^}}]*)\}} (\S+)$", text, re.MULTILINE)}


def test_a_connection_that_sends_nothing_is_closed_at_the_header_timeout(server: InProcessServer) -> None:
    with raw_connection(server) as sock:
        opened = time.monotonic()
        answer, closed = read_until_closed(sock)
    assert answer == b""  # nothing asked, nothing answered: a plain close
    assert TIMEOUT_S * 0.9 <= closed - opened < TIMEOUT_S + 2


def test_half_a_head_gets_408_at_the_header_timeout_however_it_trickles(server: InProcessServer) -> None:
    with raw_connection(server) as sock:
        opened = time.monotonic()
        sock.sendall(b"POST /v1/embeddings HTTP/1.1\r\n")
        time.sleep(TIMEOUT_S / 2)
        sock.sendall(b"Host: x\r\n")  # reads do not restart the head's clock
        answer, closed = read_until_closed(sock)
    assert answer.startswith(b"HTTP/1.1 408 Request Timeout\r\n"), answer
    assert b"connection: close" in answer
    assert error_code(answer) == "header_timeout"
    assert TIMEOUT_S * 0.9 <= closed - opened < TIMEOUT_S + 2


def test_a_body_that_stalls_gets_408_and_the_route_never_sees_half_of_it(
    server: InProcessServer, logged: pytest.LogCaptureFixture
) -> None:
    head = b"POST /v1/embeddings HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
    with raw_connection(server) as sock:
        sock.sendall(head % len(BODY) + BODY[:10])
        stalled = time.monotonic()
        answer, closed = read_until_closed(sock)
    assert answer.startswith(b"HTTP/1.1 408 Request Timeout\r\n"), answer
    assert error_code(answer) == "body_timeout"
    assert TIMEOUT_S * 0.9 <= closed - stalled < TIMEOUT_S + 2
    # Counted and logged as the 408 the client got, not as a client that left or a server error.
    assert wait_until(lambda: "its body stalled past --body-timeout; answered 408" in logged.text, 5), logged.text
    statuses = metric_values(server, "poolserve_requests_total")
    assert any('status="408"' in labels for labels in statuses), statuses


def test_a_slow_client_within_the_timeouts_is_served(server: InProcessServer) -> None:
    """Head in two parts, then a body a few bytes at a time over 1.5 body timeouts: each gap is under
    one, so the whole upload is fine."""
    head = b"POST /v1/embeddings HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n" % len(
        BODY
    )
    with raw_connection(server) as sock:
        started = time.monotonic()
        sock.sendall(head)
        time.sleep(TIMEOUT_S / 3)
        sock.sendall(b"Connection: close\r\n\r\n")
        pieces = [BODY[i : i + 8] for i in range(0, len(BODY), 8)]
        for piece in pieces:
            time.sleep(1.5 * TIMEOUT_S / len(pieces))
            sock.sendall(piece)
        answer, _ = read_until_closed(sock)
    assert time.monotonic() - started > 1.5 * TIMEOUT_S
    assert answer.startswith(b"HTTP/1.1 200 OK\r\n"), answer
    assert b'"embedding"' in answer


def test_answers_on_one_keep_alive_connection_each_arrive_whole_head_included(server: InProcessServer) -> None:
    """uvicorn's cycle writes through apiserver/connection/response_writes.py, which holds an answer's head to send it
    with the body's first part: a HEAD answer has no body, so its head must leave alone, at once, on a connection
    that stays open; the answers around it arrive whole too."""
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=5)
    try:
        for method in ("GET", "HEAD", "HEAD", "POST", "GET"):
            connection.request(
                method,
                "/v1/embeddings" if method == "POST" else "/health",
                body=BODY if method == "POST" else None,
                headers={"Content-Type": "application/json"},
            )
            answer = connection.getresponse()
            body = answer.read()
            assert answer.status == 200, (method, answer.status, body)
            assert (body == b"") == (method == "HEAD") and not answer.will_close
    finally:
        connection.close()


def test_the_timed_out_connections_are_counted_by_reason(server: InProcessServer) -> None:
    """After the tests above (in file order): one silent and one half-head connection, and one stalled body."""
    timed_out = metric_values(server, "poolserve_connections_timed_out_total")
    by_reason = Counter[str]()
    for labels, value in timed_out.items():
        by_reason[re.search(r'reason="(\w+)"', labels)[1]] += int(value)  # type: ignore[index]
    assert by_reason["header"] >= 2 and by_reason["body"] >= 1, timed_out


def test_websocket_upgrades_are_answered_as_http_and_give_their_connection_slot_back(
    server: InProcessServer, logged: pytest.LogCaptureFixture
) -> None:
    """uvicorn handed an upgraded connection to its WebSocket protocol, out of the count's sight: every
    upgrade leaked a slot until the servers answered everyone 503. Six times the server's slots here. The gauge is
    this process's, which other in-process servers moved: read relative to the start (each read is a connection)."""
    idle = sum(metric_values(server, "poolserve_open_connections").values())
    upgrade = (
        b"GET /health/live HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n"
        b"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n"
    )
    for _ in range(3 * 2 * LIMIT):
        with raw_connection(server) as sock:
            sock.sendall(upgrade)
            answer, _ = read_until_closed(sock)  # the server closes after its answer
        assert answer.startswith(b"HTTP/1.1 200 OK\r\n"), answer
        assert b"\r\nconnection: close\r\n" in answer.lower()
    with urllib.request.urlopen(server.url + "/health/live", timeout=10) as response:
        assert response.status == 200
    # The last closes reach the servers' counts within a loop turn or two (longer on a busy host).
    assert wait_until(lambda: sum(metric_values(server, "poolserve_open_connections").values()) <= idle, 10)
    assert "Unsupported upgrade request" not in logged.text


def test_past_the_limit_new_connections_get_503_and_are_counted(
    server: InProcessServer, logged: pytest.LogCaptureFixture
) -> None:
    """The server fills to --max-connections-per-server with idle keep-alive connections; the extra ones get 503
    with Retry-After, and the refusals are counted and logged."""
    # Counters and gauges are this process's, which other in-process servers moved: read relative to the start.
    refused_before = metric_values(server, "poolserve_connections_refused_total")
    idle = metric_values(server, "poolserve_open_connections")  # the read's own connection included
    held: list[http.client.HTTPConnection] = []
    try:
        servers: Counter[str] = Counter()
        for _ in range(LIMIT):
            connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
            connection.request("GET", "/health/live")
            response = connection.getresponse()
            response.read()
            assert response.status == 200
            servers[response.getheader("x-poolserve-server", "")] += 1
            held.append(connection)
        assert servers == {"0": LIMIT}
        for _ in range(3):
            extra = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
            started = time.monotonic()
            extra.request("GET", "/health/live")
            response = extra.getresponse()
            body = response.read()
            extra.close()
            assert time.monotonic() - started < 2
            assert response.status == 503, body
            assert response.getheader("retry-after") == "1"
            assert response.getheader("connection") == "close"
            assert msgspec.json.decode(body)["error"]["code"] == "server_full"
        # One held connection goes; the scrape takes its place.
        held.pop().close()
        time.sleep(0.2)
        refused = {
            labels: count - refused_before.get(labels, 0.0)
            for labels, count in metric_values(server, "poolserve_connections_refused_total").items()
        }
        assert sum(refused.values()) == 3, refused
        assert all('reason="full"' in labels for labels, count in refused.items() if count), refused
        open_now = metric_values(server, "poolserve_open_connections")
        assert open_now == {'server="0"': idle['server="0"'] + LIMIT - 1}, (idle, open_now)
        assert "refused 1 new connection(s) with 503" in logged.text
    finally:
        for connection in held:
            connection.close()
