"""The harness the bench and the end-to-end tests share: launching servers, steady load."""

from __future__ import annotations

import random
import sys

import pytest

from bench.harness.server_process import POOLSERVE_READY, ServerProcess, StartError, start_trivial_server
from bench.harness.steady_load import SteadyLoad


def test_steady_load_counts_every_reply_and_each_client_makes_its_own_bodies() -> None:
    bodies: list[object] = []

    def body(rng: random.Random) -> dict[str, object]:
        bodies.append(made := {"input": [f"sentence {rng.randint(0, 10**6)}"]})
        return made

    with start_trivial_server() as server, SteadyLoad(server.url, clients=2, body=body) as load:
        load.wait_for(20, timeout=20)
    assert set(load.statuses) == {200}
    assert load.failures == [] and load.misses == []
    assert load.total == sum(load.statuses.values()) == len(load.latencies)
    assert len(bodies) >= load.total


def test_a_server_that_exits_before_its_ready_line_fails_with_its_output() -> None:
    argv = [sys.executable, "-c", "import sys; print('cannot start: no model', file=sys.stderr); sys.exit(3)"]
    with ServerProcess("doomed", argv) as server:
        with pytest.raises(StartError, match=r"(?s)doomed exited with 3 before ready.*cannot start: no model"):
            server.wait_for_line(POOLSERVE_READY, timeout=20)
        assert server.wait_exit(5) == 3
        assert "cannot start: no model" in server.log()
    assert server.is_stopped
