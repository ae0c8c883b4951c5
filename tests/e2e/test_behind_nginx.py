"""A real nginx in front, with an upstream keep-alive pool, as a deployment would have it."""

from __future__ import annotations

import asyncio
import re
import signal
from collections import Counter
from pathlib import Path

import msgspec
import pytest

from bench.harness.clients import RawClient, prepare_request
from bench.harness.scrape import scrape, value
from bench.harness.server_process import PoolserveProcess, wait_until
from bench.harness.steady_load import SteadyLoad
from tests.e2e.nginx import nginx_in_front, nginx_or_skip


@pytest.fixture(scope="module")
def nginx_binary() -> str:
    return nginx_or_skip()


def through_proxy(url: str, clients: int = 32, requests: int = 10) -> tuple[Counter[str], Counter[int]]:
    """`clients` keep-alive clients of the proxy, `requests` embedding requests each."""
    request = prepare_request(
        "POST", "/v1/embeddings", msgspec.json.encode({"input": "routed through a proxy"}), url.split("://")[1]
    )

    async def run() -> tuple[Counter[str], Counter[int]]:
        servers: Counter[str] = Counter()
        statuses: Counter[int] = Counter()

        async def client() -> None:
            connection = await RawClient(url).connect()
            for _ in range(requests):
                reply = await connection.send(request)
                statuses[reply.status] += 1
                servers[reply.server] += 1
            connection.close()

        await asyncio.gather(*(client() for _ in range(clients)))
        return servers, statuses

    return asyncio.run(run())


def test_requests_through_nginx_keepalive_spread_over_both_servers_before_and_after_sighup(
    nginx_binary: str, tmp_path: Path, server: PoolserveProcess
) -> None:
    """On the session's server (tests/conftest.py: 2 API servers); it serves on after its SIGHUP, as any server does."""
    with nginx_in_front(nginx_binary, [f"127.0.0.1:{server.port}"], tmp_path) as nginx:
        proxy = nginx.url
        servers, statuses = through_proxy(proxy)
        assert statuses == {200: 320}, statuses
        assert min(servers["0"], servers["1"]) >= 320 * 0.3, servers

        mark = len(server.stderr())
        server.proc.send_signal(signal.SIGHUP)
        replaced = re.compile(r"api-1: pid \d+ is ready; pid \d+ drains and stops")
        assert wait_until(lambda: replaced.search(server.stderr()[mark:]), 60), server.log()
        assert wait_until(lambda: len(server.child_pid("apiserver")) == 2, 60), server.log()

        servers, statuses = through_proxy(proxy)
        assert statuses == {200: 320}, statuses
        assert min(servers["0"], servers["1"]) >= 320 * 0.3, servers


def requests_answered(server: PoolserveProcess) -> float:
    """The embedding requests one poolserve instance answered, from its own /metrics."""
    return value(scrape(server.url), "poolserve_requests_total", endpoint="/v1/embeddings", status="200")


def test_two_instances_behind_nginx_one_stopped_and_started_again_no_request_fails(
    nginx_binary: str, tmp_path: Path, server: PoolserveProcess
) -> None:
    """The replica case (docs/scaling.md): SIGTERM drains an instance while nginx sends its new requests to
    the other, and once it is started again nginx sends it work again; the client never sees a failure. The other
    instance is the session's server (tests/conftest.py), which stays up throughout."""
    first = PoolserveProcess("--api-server-count", "1")
    second = server
    try:
        first.wait_ready(timeout=120)
        port = first.port
        second_before = requests_answered(second)
        with nginx_in_front(nginx_binary, [f"127.0.0.1:{first.port}", f"127.0.0.1:{second.port}"], tmp_path) as nginx:
            proxy = nginx.url
            with SteadyLoad(proxy, clients=8) as load:
                load.wait_for(60)
                assert requests_answered(first) > 0 and requests_answered(second) > second_before
                first.proc.send_signal(signal.SIGTERM)
                assert first.wait_exit(60) == 0, first.log()
                load.wait_for(sum(load.statuses.values()) + 60)
                first = PoolserveProcess("--api-server-count", "1", "--port", str(port))
                first.wait_ready(timeout=120)
                assert wait_until(lambda: requests_answered(first) >= 20, 30), "nginx sent the restarted one nothing"
            assert load.failures == [], load.failures
            assert set(load.statuses) == {200}, load.statuses
    finally:
        first.stop()
