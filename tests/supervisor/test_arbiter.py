"""The supervisor's loop on stub children that speak the boot pipe (stubs.py, stub_child.py): its decisions (restart,
back-off, giving up, out of service, rolling restart, scaling) and its exit codes, in seconds and without torch.

What only real processes show (signals reaching real children, the shared socket under load, a real engine's crash
mid-pass) stays in tests/e2e/."""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import re
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from bench.harness.server_process import wait_until
from poolserve.config import Config
from supervisor.arbiter import EXIT_GAVE_UP, EXIT_OK, EXIT_START_FAILED, METRICS_DIR_ENV
from supervisor.restart_policy import RestartPolicy
from tests.supervisor.stubs import Run, is_stub, stub_run

# Back-off waits a tenth of the real ones where a test is about what happens past them, not about the waits.
QUICK = RestartPolicy(first_backoff=0.05)


def test_sigttin_and_sigttou_change_the_number_of_api_servers(stubs: Run) -> None:
    stubs.supervise(Config(api_server_count=2, port=0))

    def scenario(run: Run) -> None:
        run.wait_started()
        mark = len(run.records)
        os.kill(os.getpid(), signal.SIGTTIN)
        run.wait_log(r"api-2 \(pid \d+\) is ready", since=mark)
        assert wait_until(lambda: len(run.live("api-")) == 3, 10), run.events()
        # One signal at a time (the same signal sent again before it is handled counts once); the third is
        # refused: one API server is the minimum.
        for handled in ("scaling down to 2", "scaling down to 1", "1 API server is the minimum"):
            os.kill(os.getpid(), signal.SIGTTOU)
            run.wait_log(handled, since=mark)
        assert wait_until(lambda: len(run.live("api-")) == 1, 10), run.events()
        # The two retired drained (SIGTERM) rather than being killed; the one left serves on the shared socket.
        assert sorted(event.name for event in run.events() if event.what == "term") == ["api-1", "api-2"]
        assert run.ask() == f"api-0 {run.pids('api-0')[0]}"
        # Scaling up again starts the lowest free index.
        mark = len(run.records)
        os.kill(os.getpid(), signal.SIGTTIN)
        run.wait_log(r"api-1 \(pid \d+\) is ready", since=mark)

    assert stubs.run(scenario) == EXIT_OK, stubs.log()
    assert "SIGTTIN: scaling up to 3 API server(s)" in stubs.log()


def test_a_crash_looping_api_server_makes_the_supervisor_give_up_loudly(stubs: Run) -> None:
    stubs.supervise(Config(api_server_count=1, port=0), policy=QUICK)
    killed: set[int] = set()

    def scenario(run: Run) -> None:
        run.wait_started()
        deadline = time.monotonic() + 30
        while run.is_running and time.monotonic() < deadline:
            for pid in set(run.live("api-0")) - killed:
                os.kill(pid, signal.SIGKILL)
                killed.add(pid)
            time.sleep(0.02)

    assert stubs.run(scenario) == EXIT_GAVE_UP, stubs.log()
    assert len(killed) >= 6
    giving_up = [line for line in stubs.stderr.splitlines() if line.startswith("poolserve: giving up")]
    assert len(giving_up) == 1 and "api-0 stopped unexpectedly 6 times within 60s" in giving_up[0], stubs.stderr
    assert not [event.pid for event in stubs.events() if is_stub(event.pid)]  # the engine stopped too


def test_restarts_back_off_as_the_crashes_repeat(stubs: Run) -> None:
    """Crashes 1-4 within the window: restarted at once, then after 0.5, 1 and 2 s (the real policy)."""
    stubs.order("api-0", "ready kill", "ready kill", "ready kill", "ready kill", "ready")
    stubs.supervise(Config(api_server_count=1, port=0))

    def scenario(run: Run) -> None:
        run.wait_started()
        assert wait_until(lambda: len(run.pids("api-0", "ready")) == 5, 20), run.log()

    assert stubs.run(scenario) == EXIT_OK, stubs.log()
    waits = [
        float(m) if m else 0.0
        for m in re.findall(r"api-0 \(pid \d+\) was killed by SIGKILL; restarting it(?: in ([\d.]+)s)?", stubs.log())
    ]
    assert waits == [0.0, 0.5, 1.0, 2.0], stubs.log()
    # Each restart came no sooner than its wait after the crash.
    kills = [event.at for event in stubs.events() if event.name == "api-0" and event.what == "kill"]
    starts = [event.at for event in stubs.events() if event.name == "api-0" and event.what == "start"][1:]
    assert all(start - kill >= wait for kill, start, wait in zip(kills, starts, waits, strict=True)), (kills, starts)
    assert "restarting it in 2.0s (crash 4 within 60s)" in stubs.log()


def test_a_port_in_use_fails_start_up_with_one_clear_line(stubs: Run) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        stubs.supervise(Config(api_server_count=1, port=port))
        assert stubs.run() == EXIT_START_FAILED, stubs.log()
    lines = [line for line in stubs.stderr.splitlines() if line.startswith("poolserve: could not start")]
    assert lines == [f"poolserve: could not start: cannot listen on 127.0.0.1:{port}: Address already in use"]
    assert stubs.events() == []  # no child was started


def test_an_engine_that_fails_to_boot_fails_start_up_with_one_clear_line(stubs: Run) -> None:
    stubs.order("engine", "fail cannot load /models/no-such-model: no such folder")
    stubs.supervise(Config(api_server_count=1, port=0))
    assert stubs.run() == EXIT_START_FAILED, stubs.log()
    lines = [line for line in stubs.stderr.splitlines() if line.startswith("poolserve: could not start")]
    assert lines == ["poolserve: could not start: engine failed: cannot load /models/no-such-model: no such folder"]
    assert "ready" not in stubs.stdout
    assert stubs.pids("api-0") == []  # API servers start only once the engines are ready


def test_a_child_that_fails_to_boot_on_its_restart_halts_instead_of_crash_looping(stubs: Run) -> None:
    stubs.order("engine", "ready sleep 0.5 kill", "fail the model folder is gone")
    stubs.supervise(Config(api_server_count=1, port=0))
    assert stubs.run(lambda run: run.wait_stopped()) == EXIT_START_FAILED, stubs.log()
    assert "poolserve: could not start: engine failed to start again: the model folder is gone" in stubs.stderr
    assert len(stubs.pids("engine")) == 2  # no third start
    assert not [event.pid for event in stubs.events() if is_stub(event.pid)]


def test_a_child_that_never_reports_is_given_up_on_at_the_start_timeout(stubs: Run) -> None:
    stubs.order("engine", "sleep 3600")
    stubs.supervise(Config(api_server_count=1, port=0, engine_start_timeout=1))
    started = time.monotonic()
    assert stubs.run() == EXIT_START_FAILED, stubs.log()
    assert time.monotonic() - started < 10
    assert "poolserve: could not start: engine not ready after 1s" in stubs.stderr


def test_sigterm_stops_the_api_servers_then_the_engine_and_exits_0(stubs: Run) -> None:
    stubs.supervise(Config(api_server_count=2, port=0))
    assert stubs.run(lambda run: run.wait_started()) == EXIT_OK, stubs.log()
    terms = [event for event in stubs.events() if event.what == "term"]
    assert sorted(event.name for event in terms) == ["api-0", "api-1", "engine"]
    assert terms[-1].name == "engine"  # after both API servers had stopped: their drain needs it
    assert "received SIGTERM; shutting down" in stubs.log()
    assert [path.name for path in stubs.folder.parent.iterdir() if path.name.startswith("poolserve-")] == []


def test_a_start_removes_only_the_folders_of_dead_supervisors_and_sigint_stops_as_sigterm_does(
    stubs: Run, caplog: pytest.LogCaptureFixture
) -> None:
    """The start's side of a supervisor killed with SIGKILL (its children gone, its folder left: tests/e2e/
    test_faults.py, on a launch): the next start removes that folder, by the PID in its name, and no folder of
    a process that runs or of no PID at all (what is removed: tests/supervisor/test_runtime_dir.py). Then SIGINT, as
    Ctrl-C in a terminal sends it, stops the server as cleanly as SIGTERM."""
    parent = stubs.folder.parent  # the stubs' TMPDIR: where runtime folders go
    dead = subprocess.Popen(["true"])
    dead.wait()
    stale = parent / f"poolserve-{dead.pid}-abc123"
    (stale / "metrics").mkdir(parents=True, mode=0o700)
    alive = parent / f"poolserve-{os.getppid()}-abc123"  # pytest's parent: a running process
    alive.mkdir(mode=0o700)
    unnamed = parent / "poolserve-abc123"  # no PID in the name: not known to be stale
    unnamed.mkdir(mode=0o700)

    def scenario(run: Run) -> None:
        run.wait_started()
        assert not stale.exists() and alive.is_dir() and unnamed.is_dir()
        mine = [path for path in parent.iterdir() if path.name.startswith(f"poolserve-{os.getpid()}-")]
        assert len(mine) == 1 and mine[0].is_dir()  # its own, made after the stale ones went
        os.kill(os.getpid(), signal.SIGINT)
        run.wait_stopped()

    caplog.set_level(logging.INFO, logger="supervisor.runtime_dir")
    stubs.supervise(Config(api_server_count=1, port=0))
    assert stubs.run(scenario) == EXIT_OK, stubs.log()
    removed = [record.getMessage() for record in caplog.records if record.name == "supervisor.runtime_dir"]
    assert removed == [f"removed {stale}, left by a supervisor (pid {dead.pid}) that no longer runs"]
    assert "received SIGINT; shutting down" in stubs.log()
    assert sorted(event.name for event in stubs.events() if event.what == "term") == ["api-0", "engine"]
    assert not [event.pid for event in stubs.events() if is_stub(event.pid)]
    assert sorted(path.name for path in parent.iterdir() if path.name.startswith("poolserve-")) == sorted(
        [alive.name, unnamed.name]
    )


def test_an_api_server_that_stops_answering_is_replaced_and_its_sibling_serves_on(stubs: Run) -> None:
    stubs.supervise(Config(api_server_count=2, port=0, worker_timeout=3))

    def scenario(run: Run) -> None:
        run.wait_started()
        mark = len(run.records)
        (victim,) = run.pids("api-0")
        # Seen from outside, a stopped process is a blocked event loop: no heartbeat, no accept.
        os.kill(victim, signal.SIGSTOP)
        try:
            assert run.ask().startswith("api-1 ")
            run.wait_log(rf"api-0 \(pid (?!{victim}\))\d+\) is ready", timeout=15, since=mark)
        finally:
            with contextlib.suppress(ProcessLookupError):  # killed and reaped by now
                os.kill(victim, signal.SIGCONT)
        assert wait_until(lambda: not is_stub(victim), 5)
        run.wait_log(r"api-0 \(pid \d+\) sent no heartbeat for 3s \(--worker-timeout 3\): it is hung", since=mark)
        assert {run.ask().split()[0] for _ in range(4)} <= {"api-0", "api-1"}
        assert len(run.live("api-")) == 2

    assert stubs.run(scenario) == EXIT_OK, stubs.log()


def out_of_service(supervisor: Any, engine: str) -> float:
    """The engine's poolserve_engine_out_of_service value, whichever model it serves."""
    gauge = supervisor.metrics.ENGINES_OUT_OF_SERVICE
    return float(next(s.value for metric in gauge.collect() for s in metric.samples if s.labels["engine"] == engine))


def crash_loop(run: Run, name: str) -> list[int]:
    """Kill child `name` again and again, each new process as soon as it starts, until the supervisor takes it out of
    service (or stops); the pids killed."""
    killed: list[int] = []
    while run.is_running and not any("taken out of service" in line for line in run.records):
        assert len(killed) < 8, run.log()
        for pid in set(run.live(name)) - set(killed):
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)
        time.sleep(0.02)
    return killed


def test_an_engine_that_crashes_again_and_again_is_taken_out_of_service_while_the_other_serves(stubs: Run) -> None:
    """More crashes than the restart policy allows, in one engine of two: that engine alone stops (named in the log,
    on the load board the API servers read, and in the metrics), the other keeps its process, and the supervisor
    serves on where it used to give up; once its time out of service is over it starts afresh."""
    supervisor = stubs.supervise(Config(api_server_count=1, port=0, engine_count=2), policy=QUICK)

    def scenario(run: Run) -> None:
        run.wait_started()
        (survivor,) = run.pids("engine-0")
        assert len(crash_loop(run, "engine-1")) == 6
        run.wait_log(
            r"engine-1 \(pid \d+\) was killed by SIGKILL: 6 crashes within 60s; taken out of service "
            r"for 300s while the other engines serve"
        )
        assert run.is_running, run.log()
        assert run.live("engine") == [survivor]
        assert supervisor.board is not None and supervisor.board.is_engine_out_of_service(1)
        assert not supervisor.board.is_engine_out_of_service(0)
        assert out_of_service(supervisor, "1") == 1

    assert stubs.run(scenario) == EXIT_OK, stubs.log()


def test_an_engine_out_of_service_starts_afresh_when_its_time_is_over(stubs: Run) -> None:
    supervisor = stubs.supervise(
        Config(api_server_count=1, port=0, engine_count=2), policy=RestartPolicy(first_backoff=0.05, out_of_service=1)
    )

    def scenario(run: Run) -> None:
        run.wait_started()
        killed = crash_loop(run, "engine-1")
        run.wait_log(r"engine-1 .* taken out of service for 1s")
        run.wait_log(r"engine-1 \(pid \d+\) is ready", since=len(run.records) - 1)
        assert supervisor.board is not None and not supervisor.board.is_engine_out_of_service(1)
        assert out_of_service(supervisor, "1") == 0
        # Its crashes were forgotten: the next one restarts it at once, as a first crash.
        mark = len(run.records)
        (fresh,) = set(run.live("engine-1")) - set(killed)
        os.kill(fresh, signal.SIGKILL)
        run.wait_log(rf"engine-1 \(pid {fresh}\) was killed by SIGKILL; restarting it;", since=mark)

    assert stubs.run(scenario) == EXIT_OK, stubs.log()


def test_a_model_whose_only_engine_crash_loops_is_taken_out_of_service_while_the_other_serves(stubs: Run) -> None:
    """The reranker's only engine past the restart policy's limit: it stops for a while, named in the log, and the
    embedder's engine keeps its process, where the whole server used to give up and take the embedder with it."""
    embedder = Config(model="/models/minilm", served_model_name=["minilm"], api_server_count=1, port=0)
    reranker = Config(model="/models/rerank", served_model_name=["rerank"], api_server_count=1, port=0)
    stubs.supervise(embedder, [embedder, reranker], policy=QUICK)

    def scenario(run: Run) -> None:
        run.wait_started()
        (kept,) = run.pids("engine-0")
        crash_loop(run, "engine-1")
        run.wait_log("taken out of service for 300s model rerank is unavailable meanwhile; the other models serve on")
        assert run.is_running and run.live("engine") == [kept]

    assert stubs.run(scenario) == EXIT_OK, stubs.log()
    consequence = "the API servers keep what was in flight and resubmit it (model rerank; the other models serve on)"
    assert f"restarting it; {consequence}" in stubs.log()


def test_sighup_replaces_the_api_servers_one_by_one_each_new_one_ready_before_the_old_drains(stubs: Run) -> None:
    stubs.supervise(Config(api_server_count=3, port=0))

    def scenario(run: Run) -> None:
        run.wait_started()
        old = {name: run.pids(name)[0] for name in ("api-0", "api-1", "api-2")}
        os.kill(os.getpid(), signal.SIGHUP)
        assert wait_until(lambda: all(len(run.pids(name, "ready")) == 2 for name in old), 20), run.events()
        assert wait_until(lambda: not set(old.values()) & set(run.live("api-")), 10), run.events()
        events = [event for event in run.events() if event.name.startswith("api-")]
        for name, pid in old.items():
            (new,) = set(run.pids(name)) - {pid}
            ready = next(e.at for e in events if e.pid == new and e.what == "ready")
            retired = next(e.at for e in events if e.pid == pid and e.what == "term")
            assert ready <= retired, f"{name}: the old process was told to stop before its replacement was ready"
        # One at a time: each replacement starts once the one before it is ready.
        starts = [e for e in events if e.what == "start" and e.pid not in old.values()]
        assert [e.name for e in starts] == ["api-0", "api-1", "api-2"]
        for before, after in itertools.pairwise(starts):
            assert next(e.at for e in events if e.pid == before.pid and e.what == "ready") <= after.at
        assert len(run.live("api-")) == 3
        run.wait_log("SIGHUP: the last API server is being replaced")

    assert stubs.run(scenario) == EXIT_OK, stubs.log()
    assert "SIGHUP: restarting 3 API server(s) one by one" in stubs.log()


def test_a_run_leaves_the_test_process_environment_as_it_found_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The supervisor sets PROMETHEUS_MULTIPROC_DIR in its own process (the test's, here) to a folder it removes when
    it stops: left set, every process a later test starts would inherit it (and fail to import prometheus_client)."""
    with pytest.MonkeyPatch.context() as monkeypatch, stub_run(tmp_path, capsys, monkeypatch) as run:
        run.supervise(Config(api_server_count=1, port=0))
        assert run.run(lambda run: run.wait_started()) == EXIT_OK, run.log()
        assert os.environ.get(METRICS_DIR_ENV)
    assert METRICS_DIR_ENV not in os.environ
