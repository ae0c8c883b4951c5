from __future__ import annotations

import asyncio

import pytest

from bench import loadgen
from bench.harness.clients import RawClient, Reply, prepare_request
from bench.harness.workloads import build_workload
from bench.loadgen import Run, run_warnings
from bench.trivial_server import OK_BODY, TrivialProtocol


def test_raw_client_reads_status_body_and_server_header_over_one_keep_alive_connection() -> None:
    async def exchange() -> tuple[list[Reply], int]:
        loop = asyncio.get_running_loop()
        server = await loop.create_server(TrivialProtocol, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        client = RawClient(f"http://127.0.0.1:{port}")
        request = prepare_request("POST", "/v1/embeddings", b'{"input": "x"}', f"127.0.0.1:{port}")
        try:
            replies = [await client.send(request) for _ in range(3)]
            return replies, len(client.every)
        finally:
            await client.close()
            server.close()
            await server.wait_closed()

    replies, connections = asyncio.run(exchange())
    assert [(r.status, r.body, r.server) for r in replies] == [(200, OK_BODY, "0")] * 3
    assert connections == 1


def test_only_replies_inside_the_window_count_and_the_count_bound_closes_it() -> None:
    workload = build_workload("version")
    run = Run(workload, [], warmup=10.0, duration=60.0, limit=2)
    inside = run.window_start + 1
    run.record(Reply(200, b"{}", "0"), "", sent=run.started, done=run.started + 1)  # during warm-up
    run.record(Reply(503, b"{}", "1"), "", sent=inside - 0.5, done=inside)
    run.record(None, "ConnectionResetError", sent=inside - 0.5, done=inside)
    run.record(Reply(200, b"{}", "1"), "", sent=inside - 0.25, done=inside)
    run.record(Reply(200, b"{}", "0"), "", sent=inside - 0.5, done=inside + 1)
    assert run.tally.ok == 2
    assert run.window_end == inside + 1  # closed at the second success
    run.record(Reply(200, b"{}", "0"), "", sent=inside, done=inside + 2)  # after the window: ignored
    assert dict(run.tally.statuses) == {"503": 1, "ConnectionResetError": 1, "200": 2}
    assert dict(run.tally.servers) == {"1": 1, "0": 1}
    assert sorted(run.tally.latencies) == [0.25, 1.5]


def test_a_run_too_short_or_a_busy_generator_is_flagged() -> None:
    assert run_warnings(1000, 0.2) == []
    assert run_warnings(3, 0.2) == ["few replies (3): lengthen --duration"]
    assert run_warnings(1000, 0.95) == ["generator busy (0.95 of a core)"]


def test_a_request_still_unanswered_after_the_drain_is_counted_as_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    """One answered at once, one never: the run ends after the drain with the second counted, not left out."""
    monkeypatch.setattr(loadgen, "DRAIN_TIMEOUT_S", 0.2)
    run = Run(build_workload("version"), [], warmup=0.0, duration=0.05, limit=0)

    async def drive() -> None:
        answered = asyncio.create_task(asyncio.sleep(0))
        lost = asyncio.create_task(asyncio.Event().wait())
        await loadgen.finish([answered, lost], run)
        assert lost.cancelled()

    asyncio.run(drive())
    assert dict(run.tally.statuses) == {"unanswered": 1}
