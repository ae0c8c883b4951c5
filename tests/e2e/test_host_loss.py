"""Losing a whole host: two poolserve instances on two "hosts" (network namespaces) behind nginx in a third,
configured as docs/operations.md recommends; every process of one host is killed at once under load."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from bench.harness.models import build_tiny512
from bench.harness.server_process import process_tree, wait_until
from bench.harness.steady_load import SteadyLoad
from tests.e2e.hosts import HostServer, Network, host_network
from tests.e2e.nginx import nginx_in_front, nginx_or_skip
from tests.utils import is_alive


@pytest.fixture(scope="module")
def tiny_embedder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 2-layer, 32-wide BERT embedder: the host's processes, not the model, are what is tested."""
    folder = tmp_path_factory.mktemp("host-loss-bert")
    build_tiny512(folder)
    return folder


def body(rng: object) -> dict[str, object]:
    # 16 texts a request, so a good share of each request's time is spent on the host, in flight.
    return {"input": [f"host loss sentence {index} about a search engine and its index" for index in range(16)]}


def test_one_host_killed_whole_under_load_through_nginx_fails_no_request(tiny_embedder: Path, tmp_path: Path) -> None:
    binary = nginx_or_skip()
    with host_network(2) as network:
        hosts = [
            HostServer(netns, Network.address(index), ["--model", str(tiny_embedder), "--api-server-count", "1"])
            for index, netns in enumerate(network.hosts)
        ]
        lost, survivor = hosts
        try:
            for host in hosts:
                host.wait_ready(timeout=120)
            proxied = nginx_in_front(binary, [host.address for host in hosts], tmp_path, netns=network.balancer)
            with proxied as proxy, SteadyLoad(proxy.url, clients=8, body=body, uds=proxy.uds) as load:
                load.wait_for(60, timeout=90)
                answered_by = {tried[-1] for tried, _ in proxy.upstream_log()}
                assert answered_by == {lost.address, survivor.address}, answered_by
                doomed = process_tree(lost.pid)
                assert len(doomed) >= 3, doomed  # supervisor, API server, engine
                os.killpg(lost.pid, signal.SIGKILL)
                lost.proc.wait(10)
                assert wait_until(lambda: not any(is_alive(pid) for pid in doomed), 10), doomed
                # Whatever nginx logs from here on, the lost host cannot have answered.
                dead = len(proxy.upstream_log())
                # nginx tries the lost host again once its fail_timeout (1 s) is over: refused, and passed on.
                assert wait_until(lambda: any(len(tried) > 1 for tried, _ in proxy.upstream_log()[dead:]), 30)
                load.wait_for(sum(load.statuses.values()) + 80, timeout=90)
            assert load.failures == [], load.failures
            assert set(load.statuses) == {200}, load.statuses
            after = proxy.upstream_log()[dead:]
            # The survivor took the load: every request answered since ended on it, and nginx's tries of the
            # lost host went on to the survivor. (Those in flight on it when it died are among the statuses
            # above: without `non_idempotent` they are nginx's 502s.)
            assert {tried[-1] for tried, _ in after} == {survivor.address}, after
            assert {status for _, status in after} == {"200"}, after
            retried = [tried for tried, _ in after if len(tried) > 1]
            assert retried and all(tried == [lost.address, survivor.address] for tried in retried), retried
        finally:
            for host in hosts:
                host.stop()
