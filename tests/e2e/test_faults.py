"""Fault injection on real processes under load: crashes, hangs, poison pills, signals, overload, disconnects.

Scaling (SIGTTIN, SIGTTOU) and the replacement of an API server whose heartbeat went silent are the supervisor's
decisions alone: tests/supervisor/test_arbiter.py, on stub children."""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import re
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest

from bench.harness.models import HANG_TOKEN, remote_code_env
from bench.harness.prober import Prober
from bench.harness.server_process import PoolserveProcess, child_pids, cmdline, role_of, wait_until
from bench.harness.steady_load import SteadyLoad
from tests.alone import wait_for_exports
from tests.utils import (
    api_server_pids,
    is_alive,
    pill_is_failed_and_its_neighbours_served,
    ready_line_time,
    runtime_dirs_of,
)


def faulty(folder: Path) -> tuple[str, ...]:
    """The flags that serve the faulty model (its own code), beside remote_code_env(folder)'s environment."""
    return ("--model", str(folder), "--trust-remote-code")


def is_settled(server: PoolserveProcess, api_servers: int) -> bool:
    """As a fresh server is: `api_servers` API servers and one engine, nothing draining, /health 200."""
    if len(server.child_pid("apiserver")) != api_servers or len(server.child_pid("engine_core")) != 1:
        return False
    try:
        with httpx.Client(base_url=server.url, timeout=5) as client:
            return client.get("/health").status_code == 200
    except httpx.HTTPError:
        return False


@contextlib.contextmanager
def settled(server: PoolserveProcess, api_servers: int) -> Iterator[PoolserveProcess]:
    """A server shared by several tests (a launch is ~10 s of the suite), handed to a test once it is
    as a fresh one would be, and checked to be so again after: each test that kills, restarts or rescales its
    processes waits for them to be back, or fails here rather than in whichever test uses it next."""
    assert wait_until(lambda: is_settled(server, api_servers), 60), f"not settled before the test\n{server.log()}"
    yield server
    assert wait_until(lambda: is_settled(server, api_servers), 60), f"not settled after the test\n{server.log()}"


@pytest.fixture
def two_api_servers(server: PoolserveProcess) -> Iterator[PoolserveProcess]:
    """The session's server (tests/conftest.py: the bundled model behind 2 API servers), settled before and after."""
    with settled(server, api_servers=2) as settled_server:
        yield settled_server


# alone: the 2 s bound is the respawn's (a Python import); beside another worker's test on a slow 2-core host it took
# 2.98 s (CI, 2026-12-07, AVX2 host: 3 x slower a pass than the AVX512 one).
@pytest.mark.alone
def test_a_killed_api_server_is_back_within_2s_and_only_its_connections_fail(
    two_api_servers: PoolserveProcess,
) -> None:
    server = two_api_servers
    victim_index = "0"
    victim = api_server_pids(server)[victim_index]
    with SteadyLoad(server.url, clients=8) as load:
        load.wait_for(40)
        # Every client's connection traced to a server before the kill: a client whose first request was still out
        # (it went out late on a busy host) failed with no server to name (CI, 2026-11-28).
        load.wait_for_every_client()
        mark = len(server.stderr())
        os.kill(victim, signal.SIGKILL)
        back_after = ready_line_time(server, f"api-{victim_index}", victim, timeout=10, since=mark)
        served_before = sum(load.statuses.values())
        load.wait_for(served_before + 40)
    # The 2 s are the restart's; a second crash within the window (another test of this module killed it first: the
    # order is random) adds the supervisor's announced back-off, its crash-loop policy (tests/supervisor/).
    delay = re.search(rf"\(pid {victim}\) was killed by SIGKILL; restarting it in ([0-9.]+)s", server.stderr()[mark:])
    backoff = float(delay.group(1)) if delay else 0.0
    assert back_after - backoff < 2.0, (
        f"api-{victim_index} back after {back_after:.2f}s ({backoff}s back-off)\n{server.log()}"
    )
    assert set(load.statuses) == {200}
    # Each client's one request in flight on the killed process may fail; nothing else.
    on_victim = [failure for failure in load.failures if failure[0] == victim_index]
    assert len(load.failures) == len(on_victim) <= load.clients, load.failures
    assert len(server.child_pid("apiserver")) == 2


def test_a_killed_engine_is_restarted_and_no_request_fails(two_api_servers: PoolserveProcess) -> None:
    server = two_api_servers
    (engine,) = server.child_pid("engine_core")
    body = {"input": [f"sentence number {i} about search and retrieval" for i in range(16)]}
    with SteadyLoad(server.url, clients=6, body=body) as load:
        load.wait_for(12)
        mark = len(server.stderr())
        os.kill(engine, signal.SIGKILL)
        ready_line_time(server, "engine", engine, timeout=60, since=mark)
        served_after_restart = sum(load.statuses.values())
        load.wait_for(served_after_restart + 12)
    assert load.failures == [], load.failures
    assert set(load.statuses) == {200}, load.statuses
    assert "resubmitting" in server.stderr()[mark:]


@pytest.fixture(scope="module")
def faulty_tmpdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The faulty launch's TMPDIR, where its runtime folder is left when its supervisor is killed."""
    return tmp_path_factory.mktemp("faulty-tmpdir")


@pytest.fixture(scope="module")
def shared_faulty_server(faulty_model: Path, faulty_tmpdir: Path) -> Iterator[PoolserveProcess]:
    env = {**remote_code_env(faulty_model), "TMPDIR": str(faulty_tmpdir)}
    with PoolserveProcess(*faulty(faulty_model), "--api-server-count", "2", "--worker-timeout", "3", env=env) as server:
        yield server.wait_ready()


@pytest.fixture
def faulty_server(shared_faulty_server: PoolserveProcess) -> Iterator[PoolserveProcess]:
    """The faulty model behind 2 API servers, whose processes are killed and replaced after 3 s without a
    heartbeat. Its tests crash or hang the engine twice each: 4 crashes within a minute, under the
    supervisor's limit of 5 (supervisor/restart_policy.py); the later restarts wait 1 and 2 s."""
    with settled(shared_faulty_server, api_servers=2) as server:
        yield server


def test_a_poison_pill_is_failed_after_two_crashes_and_the_server_serves_on(faulty_server: PoolserveProcess) -> None:
    server = faulty_server
    mark = len(server.stderr())
    pill_is_failed_and_its_neighbours_served(server)
    assert server.stderr()[mark:].count("engine (pid") >= 2


def test_a_hung_engine_reads_unhealthy_then_is_replaced(faulty_server: PoolserveProcess) -> None:
    server = faulty_server
    mark = len(server.stderr())
    (engine,) = server.child_pid("engine_core")
    result: dict[str, httpx.Response] = {}

    def hang() -> None:
        with server.client() as client:
            result["hung"] = client.post("/v1/embeddings", json={"input": [[101, HANG_TOKEN, 102]]})

    sender = threading.Thread(target=hang)
    sender.start()
    with server.client() as client:
        assert wait_until(lambda: client.get("/health").status_code == 503, 5), "a hung engine read healthy"
        body = client.get("/health/ready").json()
        assert body["error"]["code"] in ("engine_hung", "engine_unavailable")
        # /health is TEI's too: TEI's error shape.
        assert client.get("/health").json()["error_type"] == "Unhealthy"
        assert client.get("/health/live").status_code == 200
        ready_line_time(server, "engine", engine, timeout=30, since=mark)
        sender.join(90)
        # The same input hung the restarted engine too: failed as the cause, not retried forever.
        assert result["hung"].status_code == 500
        assert wait_until(lambda: client.get("/health").status_code == 200, 30)
        assert client.post("/v1/embeddings", json={"input": "fine"}).status_code == 200
    assert "sent no heartbeat" in server.stderr()[mark:]


def test_children_exit_when_the_supervisor_is_killed_and_its_runtime_folder_waits_for_the_next_start(
    shared_faulty_server: PoolserveProcess, faulty_tmpdir: Path
) -> None:
    """Last on the faulty model's launch: it ends it (its own launch was once `--api-server-count 1` with a TMPDIR of
    its own, as this one's is). Once `kill -9` of the supervisor left its runtime folder (engine socket, metrics files)
    behind for good. Its children go by themselves (only real processes show it); its folder, named for its PID, stays
    until a start removes it: tests/supervisor/test_arbiter.py's stub run, which also stops a server with SIGINT."""
    killed = shared_faulty_server
    children = child_pids(killed.pid)
    (left,) = {p for pid in children for p in runtime_dirs_of(pid)}
    os.kill(killed.pid, signal.SIGKILL)
    killed.proc.wait(5)
    assert wait_until(lambda: not any(is_alive(pid) for pid in children), 15)
    assert Path(left).is_dir() and Path(left).name.startswith(f"poolserve-{killed.pid}-")
    assert Path(left).parent == faulty_tmpdir


@dataclass
class SmallTmpfs:
    path: Path
    is_tmpfs: bool  # a 2 MiB tmpfs; False: a plain folder (mounting one needs root, or CAP_SYS_ADMIN)


@pytest.fixture(scope="module")
def small_tmpfs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SmallTmpfs]:
    """The small queue's TMPDIR: a 2 MiB tmpfs of its own where one can be mounted, else a plain folder; always
    unmounted after."""
    mount_point = tmp_path_factory.mktemp("tmpfs")
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=2m,mode=0700", "tmpfs", str(mount_point)],
        check=False,
        capture_output=True,
        text=True,
    )
    try:
        yield SmallTmpfs(mount_point, is_tmpfs=mounted.returncode == 0)
    finally:
        if mounted.returncode == 0:
            subprocess.run(["umount", str(mount_point)], check=False)
            if os.path.ismount(mount_point):
                subprocess.run(["umount", "-l", str(mount_point)], check=False)


@pytest.fixture(scope="module")
def shared_small_queue(small_tmpfs: SmallTmpfs) -> Iterator[PoolserveProcess]:
    """Also the SIGTERM test's launch, which it ends (last of its tests): JSON logs with the access log on; and the
    full-TMPDIR test's (first of its tests), with a TMPDIR of 2 MiB (the launch of each was a server of its own).
    Started once no graph export runs on the host, since the SIGTERM test bounds the start and the overload test
    /health's tail: in one clean-clone run of three its start took 13 s beyond the template's imports (3.5 s quiet)
    and /health's p99 reached 52.8 ms while other workers ran the tests that export graphs (most likely the cause; not
    shown)."""
    wait_for_exports()
    with PoolserveProcess(
        "--api-server-count", "2", "--max-queued-inputs", "32", "--engine-wait-timeout", "0.5",
        "--log-format", "json", "--access-log", env={"TMPDIR": str(small_tmpfs.path)},
    ) as server:  # fmt: skip
        yield server.wait_ready()


@pytest.fixture
def small_queue(shared_small_queue: PoolserveProcess) -> Iterator[PoolserveProcess]:
    """Two API servers in front of an engine whose queue holds 32 inputs (the overload tests), that wait at most 0.5 s
    for an engine that is gone (--engine-wait-timeout: the restart test, which kills its engine), logging JSON with the
    access log on (the SIGTERM test's). One launch for the four: each flag matters to its own tests alone (the queue's
    limit while the engine runs, the wait while it is gone, the logs' format to the SIGTERM test, which also reads its
    start and its stop), and the server is settled between them. --request-timeout's 504:
    tests/in_process/test_request_timeout.py."""
    with settled(shared_small_queue, api_servers=2) as server:
        yield server


# A request each endpoint of the bundled model answers 200.
ANSWERED_BODIES: dict[str, dict[str, object]] = {
    "/v1/embeddings": {"input": "hi"}, "/pooling": {"input": "hi"}, "/embed": {"inputs": "hi"},
    "/tokenize": {"prompt": "hi"}, "/detokenize": {"tokens": [7592]}, "/score": {"text_1": "a", "text_2": "b"},
    "/rerank": {"query": "a", "documents": ["b"]}, "/v1/rerank": {"query": "a", "documents": ["b"]},
    "/v2/rerank": {"query": "a", "documents": ["b"]},
}  # fmt: skip


def fill(folder: Path, leave: int) -> None:
    """Write one file that leaves `leave` bytes free on the filesystem of `folder`."""
    stats = os.statvfs(folder)
    size = stats.f_bavail * stats.f_frsize - leave
    with open(folder / "filler", "wb") as f:
        f.write(b"\0" * size)  # written, not fallocated: a tmpfs gives its pages as they are written


# Issue 16: mapped metric files on a full tmpfs raised SIGBUS; the crash loop took the server down in 11 s.
def test_a_full_tmpdir_costs_metric_series_and_never_a_request_or_a_process(
    small_queue: PoolserveProcess, small_tmpfs: SmallTmpfs
) -> None:
    """First on the small queue's launch, whose TMPDIR is a 2 MiB tmpfs: it fills it, and empties it after."""
    if not small_tmpfs.is_tmpfs:
        pytest.skip("cannot mount a tmpfs to fill")
    server = small_queue
    (runtime,) = [p for p in small_tmpfs.path.iterdir() if p.name.startswith("poolserve-")]
    # 2 MiB is less than the supervisor asks for 4 processes (2 API servers): it says so, and starts.
    assert "KiB free, less than 4096 KiB for 4 processes' metrics" in server.stderr(), server.tail()
    children = sorted(server.children())
    fill(small_tmpfs.path, leave=8192)
    try:
        # Requests that make new series: each endpoint and status is a series in 4 histograms and a counter.
        with server.client() as client:
            for path, body in ANSWERED_BODIES.items():
                response = client.post(path, json=body)
                assert response.status_code == 200, (path, response.text)
                # TEI's /embed answers a body of the wrong type as TEI does: 422.
                assert client.post(path, json={"wrong": 1}).status_code == (422 if path == "/embed" else 400)
                assert client.get(path).status_code == 405
            metrics = client.get("/metrics")
        assert metrics.status_code == 200
        assert sorted(server.children()) == children, server.tail()
        assert 'poolserve_restarts_total{process="api_server"} 0.0' in metrics.text
        assert 'poolserve_restarts_total{process="engine"} 0.0' in metrics.text
        dropped = re.search(r"^poolserve_metric_series_dropped_total (\S+)$", metrics.text, re.MULTILINE)
        assert dropped and float(dropped[1]) > 0, metrics.text
        assert server.stderr().count("new series are kept in memory") == 1, server.tail()
        for path in (runtime / "metrics").glob("*.db"):  # every mapped page has its block
            assert path.stat().st_blocks * 512 >= path.stat().st_size, path
    finally:
        (small_tmpfs.path / "filler").unlink()  # the tests after it on this launch have room again


def test_requests_wait_a_bounded_time_for_a_restarting_engine_then_get_503(small_queue: PoolserveProcess) -> None:
    server = small_queue
    (engine,) = server.child_pid("engine_core")
    mark = len(server.stderr())
    os.kill(engine, signal.SIGKILL)
    with server.client() as client:
        # Sent before an API server saw the engine go, a request is in flight and is resubmitted
        # (a 200); sent after, it is new and waits for the engine at most --engine-wait-timeout. Both API servers
        # must have seen it: the request may land on either.
        assert wait_until(lambda: server.stderr()[mark:].count("lost the engine") >= 2, 5)
        assert client.get("/health").status_code == 503
        started = time.monotonic()
        response = client.post("/v1/embeddings", json={"input": "during the restart"})
        assert response.status_code == 503
        assert response.headers["retry-after"] == "1"
        assert time.monotonic() - started < 3
        ready_line_time(server, "engine", engine, timeout=60, since=mark)
        assert wait_until(lambda: client.get("/health").status_code == 200, 10)
        assert client.post("/v1/embeddings", json={"input": "after the restart"}).status_code == 200


class PacedConnection(threading.Thread):
    """One keep-alive connection sending a request every `gap_s` seconds until the server answers
    `Connection: close`. http.client sends on its connection without first looking whether the server closed
    it (httpx looks, and quietly reconnects): a server that closes an idle connection just as the client
    sends shows here as the error that client gets whenever the close falls in a gap (most of each cycle)."""

    def __init__(self, url: str, gap_s: float = 0.2):
        super().__init__(daemon=True)
        parts = urlsplit(url)
        self.connection = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=30)
        self.gap_s = gap_s
        self.statuses: list[int] = []
        self.error = ""
        self.was_closed_by_server = False
        self.stopping = threading.Event()

    def run(self) -> None:
        body = json.dumps({"input": "one request now and then"})
        try:
            while not self.stopping.is_set():
                self.connection.request("POST", "/v1/embeddings", body, {"content-type": "application/json"})
                response = self.connection.getresponse()
                response.read()
                self.statuses.append(response.status)
                if response.will_close:
                    self.was_closed_by_server = True
                    return
                time.sleep(self.gap_s)
        except (OSError, http.client.HTTPException) as exc:
            self.error = repr(exc)
        finally:
            self.connection.close()


def test_sighup_replaces_every_api_server_under_load_and_fails_nothing(two_api_servers: PoolserveProcess) -> None:
    server = two_api_servers
    old = set(server.child_pid("apiserver"))
    paced = [PacedConnection(server.url) for _ in range(4)]
    with SteadyLoad(server.url, clients=8) as load:
        load.wait_for(40)
        for connection in paced:
            connection.start()
        assert wait_until(lambda: all(len(connection.statuses) >= 2 for connection in paced), 10)
        server.proc.send_signal(signal.SIGHUP)
        assert wait_until(lambda: not old & set(server.child_pid("apiserver")), 60), server.log()
        assert wait_until(lambda: len(server.child_pid("apiserver")) == 2, 30)
        served = sum(load.statuses.values())
        load.wait_for(served + 40)
    for connection in paced:
        connection.stopping.set()
        connection.join(30)
    assert load.failures == [], load.failures
    assert set(load.statuses) == {200}
    # Each paced connection's server drained: it answered the next request with `Connection: close` instead
    # of closing the connection while it was idle between two requests.
    assert [(connection.error, connection.was_closed_by_server) for connection in paced] == [("", True)] * 4
    assert {status for connection in paced for status in connection.statuses} == {200}


@pytest.mark.alone
def test_overload_gets_429_quickly_and_health_stays_fast(small_queue: PoolserveProcess) -> None:
    server = small_queue
    body = {"input": [f"an overloading sentence number {i}" for i in range(16)]}
    with SteadyLoad(server.url, clients=12, body=body) as load:
        load.wait_for(10)
        prober = Prober(server.url)  # /health every 10 ms from its own process
        prober.start()
        started = time.monotonic()
        time.sleep(4)  # the measured window, not a wait for something to happen
        health = prober.finish((started, time.monotonic()))
    assert load.failures == []
    assert set(load.statuses) == {200, 429}
    assert load.statuses[429] >= 20, load.statuses
    assert set(health["statuses"]) == {"200"}, health
    latency_ms = health["latency_ms"]
    assert latency_ms["count"] >= 100, health
    assert latency_ms["p99"] < 50, f"/health p99 {latency_ms['p99']:.1f} ms over {latency_ms['count']} probes"
    with server.client() as client:
        started = time.monotonic()
        refused = client.post("/v1/embeddings", json={"input": ["x"] * 33})
        assert refused.status_code == 413  # bigger than the whole queue: retrying cannot help
        assert time.monotonic() - started < 0.5
        assert client.post("/v1/embeddings", json=body).status_code == 200


@pytest.mark.alone
def test_429s_come_back_at_once_with_retry_after(small_queue: PoolserveProcess) -> None:
    server = small_queue
    with server.client() as client:  # the overload test's load is over: its queue empties
        assert wait_until(lambda: client.get("/health").json()["engine"]["queued_inputs"] == 0, 30)
    # Inputs near the model's 256 tokens: the queue must still be full when the next request comes, a few
    # milliseconds after /health saw it so (with 70-token inputs a bf16 host once finished first: CI got 200).
    big = {"input": [f"a long sentence about embeddings number {i} " * 24 for i in range(32)]}
    answers: list[httpx.Response] = []

    def send() -> None:
        with server.client() as client:
            answers.append(client.post("/v1/embeddings", json=big))

    first = threading.Thread(target=send)
    first.start()
    with server.client() as client:
        assert wait_until(lambda: client.get("/health").json()["engine"]["queued_inputs"] == 32, 10)
        started = time.monotonic()
        refused = client.post("/v1/embeddings", json={"input": "one more"})
        elapsed = time.monotonic() - started
    first.join(60)
    assert refused.status_code == 429
    assert refused.headers["retry-after"] == "1"
    assert refused.json()["error"]["type"] == "rate_limit_error"
    assert elapsed < 0.5
    assert [a.status_code for a in answers] == [200]


def is_refused(port: int) -> bool:
    """Whether a new connection is refused (or reset) at once, rather than answered or left waiting in a
    queue that nobody accepts from."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1) as sock:
            sock.sendall(b"GET /health/live HTTP/1.1\r\nHost: poolserve\r\nConnection: close\r\n\r\n")
            return sock.recv(1) == b""
    except (ConnectionRefusedError, ConnectionResetError):
        return True
    except TimeoutError:
        return False


def test_an_engine_template_that_is_gone_costs_one_fresh_start(small_queue: PoolserveProcess) -> None:
    """Engines on the CPU are forked from the engine template (engine_core/template.py): a restart is a fork and the
    model's load, not torch's imports again. With the template killed, the next engine starts as a fresh interpreter,
    a new template imports meanwhile, and the engine after that is forked from it; requests are served throughout."""
    server = small_queue
    (template,) = server.child_pid("engine_core.template")
    (engine,) = server.child_pid("engine_core")
    mark = len(server.stderr())
    os.kill(template, signal.SIGKILL)
    os.kill(engine, signal.SIGKILL)
    ready_line_time(server, "engine", engine, timeout=60, since=mark)
    log = server.stderr()[mark:]
    assert f"engine-template (pid {template}) exited; the next engine starts as a fresh interpreter" in log, log
    fresh = re.search(r"engine \(pid (\d+)\) is ready(, forked)?", log)
    assert fresh is not None and fresh.group(2) is None, log  # a fresh interpreter
    new = re.compile(r"engine-template \(pid (\d+)\) is ready")
    assert wait_until(lambda: new.search(server.stderr()[mark:]), 60), server.log()
    (new_template,) = server.child_pid("engine_core.template")
    mark = len(server.stderr())
    os.kill(int(fresh.group(1)), signal.SIGKILL)
    ready_line_time(server, "engine", int(fresh.group(1)), timeout=60, since=mark)
    assert f"is ready, forked from engine-template (pid {new_template})" in server.stderr()[mark:], server.log()
    with server.client() as client:
        assert client.post("/v1/embeddings", json={"input": "after"}).status_code == 200


def test_sigterm_under_load_completes_every_accepted_request_refuses_new_connections_and_exits_0(
    shared_small_queue: PoolserveProcess,
) -> None:
    """Last on its server: it ends it. Also the start and the stop of a server (ready within 10 s of the engine
    template's imports; its runtime folder gone after SIGTERM).
    10 s is a bound that catches a start-up gone wrong, not a speed target (bench target 7, <= 5 s, is measured in
    bench/): the imports of torch and transformers took 7.9-9.5 s of a quiet 2-core host's 11.3 s start, and CI saw
    a whole start of 20.8 s under the suite's load.

    It logs JSON with the access log on (no flag of its launch changes a start or a stop): every process's lines are
    JSON objects, one a line, the supervisor's shutdown included. Its load keeps under the queue's 32 inputs."""
    server = shared_small_queue
    assert wait_until(lambda: is_settled(server, api_servers=2), 60), f"not settled before the test\n{server.log()}"
    children = server.children()
    # The engine template (engine_core/template.py) beside the engine it forked and the two API servers.
    assert sorted(role_of(cmdline(pid)) for pid in children) == ["apiserver", "apiserver", "engine", "engine-template"]
    runtime_dirs = {p for pid in children for p in runtime_dirs_of(pid)}
    assert len(runtime_dirs) == 1
    with server.client() as client:
        client.post("/v1/embeddings", json={"input": "logged"}, headers={"x-request-id": "json-7"})
    body = {"input": [f"sentence {i} for a graceful shutdown" for i in range(4)]}
    # A request whose body stops half way holds the drain open (until --body-timeout, or until it is closed).
    held = socket.create_connection(("127.0.0.1", server.port))
    held.sendall(
        b"POST /v1/embeddings HTTP/1.1\r\nHost: poolserve\r\ncontent-type: application/json\r\n"
        b'content-length: 100\r\n\r\n{"input": '
    )
    with SteadyLoad(server.url, clients=6, body=body) as load:
        load.wait_for(12)
        server.proc.send_signal(signal.SIGTERM)
        # While it drains, a new connection is refused at once (a balancer sends it elsewhere), not queued
        # by the kernel for servers that no longer accept.
        assert wait_until(lambda: is_refused(server.port), 5), server.log()
        assert server.proc.poll() is None, "it should still be draining the held request"
        held.close()
        assert server.wait_exit(60) == 0, server.log()
    # Whatever got an answer got a 200; what failed never reached a server (refused or closed idle).
    assert set(load.statuses) == {200}, load.statuses
    assert all(kind in ("ConnectError", "RemoteProtocolError", "ReadError") for _, kind in load.failures)
    assert wait_until(lambda: not any(is_alive(pid) for pid in children), 5)
    assert not any(Path(d).exists() for d in runtime_dirs)
    log = server.stderr()  # read before its fixture stops it: the stop removes its log files
    records = [json.loads(line) for line in log.splitlines() if line.startswith("{")]
    assert records and {"time", "level", "process", "pid", "logger", "message"} <= set(records[0])
    access = [r for r in records if r["logger"] == "poolserve.access"]
    assert any("request_id=json-7" in r["message"] for r in access), access
    assert {r["process"] for r in records} >= {"supervisor", "engine", "api-0"}
    assert any(r["process"] == "supervisor" and "shutting down" in r["message"] for r in records), records[-5:]
    # Last, so that a slow start on a busy host leaves the stop tested. What the start does beyond the engine
    # template's imports of torch and transformers (8-9 s of one core on this 2-core host, twice that while the suite's
    # other workers share it; the supervisor logs how long they took): the supervisor's own start, the engine's fork
    # and load, the API servers' connections. A start gone wrong (stop 51's export of the ONNX graph before ready,
    # +12 s) shows in the log; the bound holds a start that stalls: 3.5 s quiet, 10.0 and 13.0 s in two clean-clone
    # runs of the suite on this 2-core host while its other workers loaded models and exported graphs, so 15 s. The
    # imports' own cost is bench/'s (bench target 7).
    messages = " ".join(r["message"] for r in records)
    imported = re.search(r"engine-template \(pid \d+\) is ready \(imported in ([\d.]+)s\)", messages)
    assert imported is not None, records[:20]
    assert "exported, optimised and packed" not in messages  # the suite's controller cached the bundled graph
    beyond = server.ready_after - float(imported.group(1))
    assert beyond < 15, f"ready after {server.ready_after:.1f}s, {beyond:.1f}s of it beyond the template's imports"


def test_a_client_that_disconnects_leaves_no_work_in_the_engine(two_api_servers: PoolserveProcess) -> None:
    server = two_api_servers
    big = {"input": [f"a long sentence about embeddings number {i} " * 8 for i in range(1500)]}
    with httpx.Client(base_url=server.url, timeout=1.0) as client, pytest.raises(httpx.ReadTimeout):
        client.post("/v1/embeddings", json=big)
    with server.client() as client:
        assert wait_until(lambda: client.get("/health").json()["engine"]["queued_inputs"] == 0, 5), client.get(
            "/health"
        ).json()
        started = time.monotonic()
        assert client.post("/v1/embeddings", json={"input": "next"}).status_code == 200
        assert time.monotonic() - started < 2


def test_health_is_200_from_the_moment_the_ready_line_is_printed(server: PoolserveProcess) -> None:
    # Asked by the session's fixture (tests/conftest.py) at once after the ready line, whichever test launched it.
    response = server.first_health
    assert response is not None and response.status_code == 200, response


# A full TMPDIR --------------------------------------------------------------------------------------------
