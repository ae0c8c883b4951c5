"""Keep-alive connections and their requests spread over the API servers (fair accept), on real processes."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import http.client
import os
import re
import signal
import time
import urllib.request
from collections import Counter
from collections.abc import Iterator

import msgspec
import pytest

from bench.harness.clients import RawClient, RawConnection, prepare_request
from bench.harness.server_process import PoolserveProcess, wait_until
from bench.spread import describe, measure_spread, open_connections_reported
from tests.utils import api_server_pids, ready_line_time

BODY = msgspec.json.encode({"input": "a short query about keep-alive connections"})


def metric_values(url: str, name: str) -> dict[str, float]:
    """`name`'s samples by their label set, from /metrics."""
    with urllib.request.urlopen(url + "/metrics", timeout=10) as response:
        text = response.read().decode()
    return {labels: float(value) for labels, value in re.findall(rf"^{name}\{{([^}}]*)\}} (\S+)$", text, re.MULTILINE)}


def scale_up(server: PoolserveProcess, to: int) -> None:
    """SIGTTIN until `to` API servers run, each new one ready (a new API server starts in a second or two: no torch)."""
    for index in range(len(server.child_pid("apiserver")), to):
        mark = len(server.stderr())
        server.proc.send_signal(signal.SIGTTIN)
        ready_line_time(server, f"api-{index}", 0, 60, since=mark)


def has_fewer_api_servers(server: PoolserveProcess, than: int) -> bool:
    return len(server.child_pid("apiserver")) < than


@contextlib.contextmanager
def scaled_back(server: PoolserveProcess) -> Iterator[PoolserveProcess]:
    """The session's server (tests/conftest.py: 2 API servers, the default connection settings), which the test may
    scale up (SIGTTIN) and restart API servers of: scaled back down to 2 (SIGTTOU) after, and checked to be so, for the
    tests that share it next. A scaled-up server spreads as one started with that many: a new API server holds
    nothing, as a fresh one does, and the gate weighs the live set (the SIGTTIN test below)."""
    try:
        yield server
    finally:
        # One SIGTTOU at a time, each waited out: two sent at once can arrive as one (signals of a kind do not queue).
        for count in range(len(server.child_pid("apiserver")), 2, -1):
            server.proc.send_signal(signal.SIGTTOU)
            assert wait_until(functools.partial(has_fewer_api_servers, server, count), 30), server.tail()
        assert wait_until(lambda: open_connections_reported(server.url) <= 1, 10)


@pytest.mark.parametrize("api_servers", [2, 4])
def test_32_keepalive_connections_opened_at_once_spread_evenly_in_every_run(
    api_servers: int, server: PoolserveProcess
) -> None:
    with scaled_back(server):
        scale_up(server, api_servers)
        paused_before = sum(metric_values(server.url, "poolserve_accept_pauses_total").values())
        # Three requests a connection: the first lands while the burst is accepted (the gate weighs it), the others
        # show the connection kept on its server. Ten a connection (3,200 requests a test, ~11 s of the model's CPU on
        # 2 cores) checked nothing more: a connection's server is chosen when it is accepted.
        runs = measure_spread(server.url, connections=32, requests=3, runs=10)
        report = "\n".join(describe(run, api_servers) for run in runs)
        for run in runs:
            assert run.failures == 0, report
            assert sum(run.connections.values()) == 32, report
            assert len(run.connections) == api_servers, report
            # The default gate (--accept-balance both) counts requests in flight beside connections, so a server
            # whose first connections already wait on the engine takes a few fewer while the burst lands: measured
            # up to 19 % here and 31 % (21/11) on a slower CI host. Left to the kernel, 88 % at 2 servers and
            # 262 % at 4 (docs/benchmarks.md, "Connections over API servers").
            assert run.worst_deviation(api_servers) <= 0.4, report
        # Most runs are near even: the middle run within 20 % (6-12 % measured).
        deviations = sorted(run.worst_deviation(api_servers) for run in runs)
        assert deviations[len(deviations) // 2] <= 0.2, report
        # The gate did the spreading (the session's server counts from its start: what these runs added).
        pauses = metric_values(server.url, "poolserve_accept_pauses_total")
        assert sum(pauses.values()) > paused_before, pauses


# One 2-server instance for the tests that only send requests -------------------------------------


@pytest.fixture(scope="module")
def two_servers(recycling_server: PoolserveProcess) -> PoolserveProcess:
    """Connections recycled after 3 requests or 2 s (tests/e2e/conftest.py)."""
    return recycling_server


def test_the_openai_client_s_own_pool_spreads_over_both_servers(two_servers: PoolserveProcess) -> None:
    from openai import AsyncOpenAI

    async def calls() -> Counter[str]:
        served: Counter[str] = Counter()
        async with AsyncOpenAI(base_url=two_servers.url + "/v1", api_key="unused", max_retries=0) as client:
            for _ in range(2):  # recycling after 3 requests a connection: the second round reconnects
                responses = await asyncio.gather(
                    *(
                        client.embeddings.with_raw_response.create(
                            model="sentence-transformers/all-MiniLM-L6-v2", input="hello"
                        )
                        for _ in range(32)
                    )
                )
                served.update(response.headers["x-poolserve-server"] for response in responses)
        return served

    served = asyncio.run(calls())
    assert sum(served.values()) == 64
    for index in ("0", "1"):
        assert 24 <= served[index] <= 40, served


def test_a_connection_closes_after_its_request_limit_and_no_request_is_cut(two_servers: PoolserveProcess) -> None:
    before = metric_values(two_servers.url, "poolserve_connections_recycled_total")
    connection = http.client.HTTPConnection(two_servers.url.split("://")[1], timeout=30)
    try:
        headers = []
        for _ in range(3):
            connection.request("POST", "/v1/embeddings", body=BODY, headers={"content-type": "application/json"})
            response = connection.getresponse()
            assert response.status == 200
            assert len(msgspec.json.decode(response.read())["data"][0]["embedding"]) == 384
            headers.append(response.getheader("connection"))
        assert headers == [None, None, "close"]
        # The server closed its end after the third response.
        assert connection.sock is None or connection.sock.recv(1) == b""
    finally:
        connection.close()
    after = metric_values(two_servers.url, "poolserve_connections_recycled_total")
    recycled = sum(v for k, v in after.items() if 'reason="requests"' in k) - sum(
        v for k, v in before.items() if 'reason="requests"' in k
    )
    assert recycled >= 1


def test_a_connection_older_than_the_age_limit_closes_after_its_next_response(two_servers: PoolserveProcess) -> None:
    connection = http.client.HTTPConnection(two_servers.url.split("://")[1], timeout=30)
    try:
        connection.request("GET", "/health/live")
        first = connection.getresponse()
        first.read()
        assert first.getheader("connection") is None
        time.sleep(2.2)
        connection.request("GET", "/health/live")
        second = connection.getresponse()
        second.read()
        assert second.status == 200 and second.getheader("connection") == "close"
    finally:
        connection.close()
    recycled = metric_values(two_servers.url, "poolserve_connections_recycled_total")
    assert any('reason="age"' in labels and value >= 1 for labels, value in recycled.items()), recycled


def test_a_burst_of_2000_new_connections_while_servers_gate_is_answered_in_full(two_servers: PoolserveProcess) -> None:
    """Keep-alive connections held unevenly keep the gate busy while 2,000 one-request connections
    arrive, 200 at a time: none is lost in the listen queue, none refused."""
    host = two_servers.url.split("://")[1]
    request = prepare_request("GET", "/health/live", b"", host)

    async def burst() -> tuple[Counter[int], Counter[str], list[str]]:
        held = [await RawClient(two_servers.url).connect() for _ in range(12)]
        statuses: Counter[int] = Counter()
        servers: Counter[str] = Counter()
        errors: list[str] = []
        gate = asyncio.Semaphore(200)

        async def one() -> None:
            async with gate:
                try:
                    connection = await RawClient(two_servers.url).connect()
                    reply = await asyncio.wait_for(connection.send(request), 30)
                    connection.close()
                    statuses[reply.status] += 1
                    servers[reply.server] += 1
                except (OSError, TimeoutError) as exc:
                    errors.append(type(exc).__name__)

        await asyncio.gather(*(one() for _ in range(2000)))
        for connection in held:
            connection.close()
        return statuses, servers, errors

    statuses, servers, errors = asyncio.run(burst())
    assert errors == []
    assert statuses == {200: 2000}
    assert set(servers) == {"0", "1"}, servers


# The live set: scaling up and a crash change the fair share at once ------------------------------


async def hold(url: str, count: int) -> tuple[list[RawConnection], Counter[str]]:
    """Open `count` connections at once and ask each which server holds it."""
    host = url.split("://")[1]
    request = prepare_request("GET", "/health/live", b"", host)
    client = RawClient(url)
    connections = list(await asyncio.gather(*(client.connect() for _ in range(count))))
    replies = await asyncio.gather(*(connection.send(request) for connection in connections))
    return connections, Counter(reply.server for reply in replies)


def test_a_server_added_or_restarted_gets_the_new_connections_until_it_holds_its_share(
    server: PoolserveProcess,
) -> None:
    with scaled_back(server):

        async def scenario() -> None:
            first, held = await hold(server.url, 16)
            assert 6 <= held["0"] <= 10 and 6 <= held["1"] <= 10, held
            # The gauge says the same, per server (the scrape's own connection included).
            gauge = await asyncio.to_thread(metric_values, server.url, "poolserve_open_connections")
            assert sum(gauge.values()) == 17, gauge
            assert gauge['server="0"'] >= held["0"] and gauge['server="1"'] >= held["1"], (gauge, held)
            # SIGTTIN: a third server starts with nothing; of 12 new connections it takes most.
            mark = len(server.stderr())  # the shared server's log has ready lines of earlier scalings
            server.proc.send_signal(signal.SIGTTIN)
            await asyncio.to_thread(ready_line_time, server, "api-2", 0, 60, mark)
            second, held = await hold(server.url, 12)
            assert held["2"] >= 8, held
            # api-0 is killed with its connections; its replacement starts at 0 and takes the new ones
            # (the dead process's count is not left behind on the board).
            victim = api_server_pids(server)["0"]
            server_children_before = len(server.child_pid("apiserver"))
            mark = len(server.stderr())
            os.kill(victim, signal.SIGKILL)
            await asyncio.to_thread(ready_line_time, server, "api-0", victim, 60, mark)
            assert len(server.child_pid("apiserver")) == server_children_before
            third, held = await hold(server.url, 9)
            assert held["0"] >= 7, held
            for connection in first + second + third:
                connection.close()

        asyncio.run(scenario())
        assert wait_until(lambda: open_connections_reported(server.url) <= 1, 10)
