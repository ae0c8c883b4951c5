"""Each client address's share of an API server's connections (--max-connections-per-client), on the API server of
`launch` (stack_server.py: its GatedServer and connection policy, counting by peer address at accept). What needs
several API servers behind the shared socket: tests/apiserver/connection/test_fair_accept.py,
tests/e2e/test_connection_spread.py."""

from __future__ import annotations

import contextlib
import logging
import re
import socket
import urllib.error
import urllib.request
from collections.abc import Iterator

import msgspec
import pytest

from bench.harness.server_process import wait_until
from tests.in_process.stack_server import InProcessServer, served
from tests.utils import FLOAT32_CPU

REFUSED = "poolserve_connections_refused_total"


@pytest.fixture(scope="module")
def shared_by_client() -> Iterator[InProcessServer]:
    """--max-connections-per-client 2. No address is a trusted proxy here (stack_server.py trusts none): as under
    `launch` with FORWARDED_ALLOW_IPS naming another host, loopback clients are counted like any client."""
    with served("--max-connections-per-client", "2", *FLOAT32_CPU) as started:
        yield started


def read_until_closed(sock: socket.socket) -> bytes:
    received = b""
    with contextlib.suppress(ConnectionResetError):
        while chunk := sock.recv(65536):
            received += chunk
    return received


def error_code(answer: bytes) -> str:
    code: str = msgspec.json.decode(answer.split(b"\r\n\r\n", 1)[1])["error"]["code"]
    return code


def refused_by_share(server: InProcessServer) -> float | None:
    """poolserve_connections_refused_total{reason="client_share"}, summed; None while the scrape is itself refused.
    Counters here are the test process's own, shared by every in-process server: tests read what they add."""
    try:
        with urllib.request.urlopen(server.url + "/metrics", timeout=10) as response:
            text = response.read().decode()
    except urllib.error.HTTPError as exc:
        if exc.code != 503:
            raise
        return None
    found = re.findall(rf'^{REFUSED}\{{[^}}]*reason="client_share"[^}}]*\}} (\S+)$', text, re.MULTILINE)
    return sum(float(value) for value in found)


def test_one_client_address_holds_at_most_its_share_and_newcomers_still_get_in(
    shared_by_client: InProcessServer, caplog: pytest.LogCaptureFixture
) -> None:
    """64 idle connections from one address used to shut every newcomer out; with --max-connections-per-client 2 (and
    loopback not trusted as a proxy), that address's third connection gets 503 while another address is served."""
    server = shared_by_client
    before = refused_by_share(server)
    assert before is not None
    caplog.set_level(logging.WARNING, logger="poolserve.api")
    held = []
    for _ in range(2):
        sock = socket.create_connection(("127.0.0.1", server.port), timeout=10)
        sock.sendall(b"GET /health/live HTTP/1.1\r\nhost: x\r\n\r\n")
        assert sock.recv(65536).startswith(b"HTTP/1.1 200")
        held.append(sock)
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as extra:
        extra.sendall(b"GET /health/live HTTP/1.1\r\nhost: x\r\n\r\n")
        answer = read_until_closed(extra)
    assert answer.startswith(b"HTTP/1.1 503") and error_code(answer) == "too_many_connections", answer
    other = socket.create_connection(("127.0.0.1", server.port), timeout=10, source_address=("127.0.0.2", 0))
    other.sendall(b"GET /health/live HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
    answer = read_until_closed(other)
    other.close()
    assert answer.startswith(b"HTTP/1.1 200"), answer
    for sock in held:
        sock.close()
    # The scrape comes from the same address: it gets in once the server has seen those closes.
    after: list[float] = []

    def scraped() -> bool:
        found = refused_by_share(server)
        if found is not None:
            after.append(found)
        return found is not None

    assert wait_until(scraped, 5)
    # The extra connection, and any scrape that came before the closes were seen.
    assert after[0] - before >= 1, (before, after)
    assert wait_until(lambda: "their client holds its --max-connections-per-client share of 2" in caplog.text, 5)
