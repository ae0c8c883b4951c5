"""Starting and stopping real poolserve processes from tests, like gunicorn's signal tests do."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

import httpx

READY_LINE = re.compile(r"poolserve ready in [\d.]+s on http://(?P<host>[^:]+):(?P<port>\d+)")


class LaunchedServer:
    """A `launch` process in its own session, on a free port, with its output kept for failure messages."""

    def __init__(self, *args: str, env: dict[str, str] | None = None):
        self.args = ["--host", "127.0.0.1", "--port", "0", *args]
        self._out = tempfile.NamedTemporaryFile(prefix="poolserve-test-", suffix=".out", delete=False)
        self._err = tempfile.NamedTemporaryFile(prefix="poolserve-test-", suffix=".err", delete=False)
        full_env = {**os.environ, "HF_HUB_OFFLINE": "1", **(env or {})}
        self.started_at = time.monotonic()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "supervisor", *self.args],
            stdout=self._out,
            stderr=self._err,
            env=full_env,
            start_new_session=True,
        )
        self.port = 0
        self.ready_after = 0.0

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stdout(self) -> str:
        return Path(self._out.name).read_text(errors="replace")

    def stderr(self) -> str:
        return Path(self._err.name).read_text(errors="replace")

    def log(self) -> str:
        return f"--- stdout ---\n{self.stdout()}\n--- stderr ---\n{self.stderr()}"

    def wait_ready(self, timeout: float = 60.0) -> LaunchedServer:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            match = READY_LINE.search(self.stdout())
            if match:
                self.port = int(match["port"])
                self.ready_after = time.monotonic() - self.started_at
                return self
            if self.proc.poll() is not None:
                raise AssertionError(f"launch exited with {self.proc.returncode} before ready\n{self.log()}")
            time.sleep(0.05)
        raise AssertionError(f"launch not ready after {timeout}s\n{self.log()}")

    def wait_exit(self, timeout: float = 30.0) -> int:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"launch did not exit within {timeout}s\n{self.log()}") from None

    def children(self) -> list[int]:
        return child_pids(self.pid)

    def child_pid(self, module: str) -> list[int]:
        """Pids of children started as `python -m <module>`."""
        return [pid for pid in self.children() if module in cmdline(pid)]

    def stop(self) -> None:
        """SIGTERM, then SIGKILL for the whole process group if anything is left."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(30)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(5)
        for f in (self._out, self._err):
            f.close()
            with contextlib.suppress(FileNotFoundError):
                os.unlink(f.name)

    def client(self, **kwargs: object) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=60, **kwargs)  # type: ignore[arg-type]


def child_pids(pid: int) -> list[int]:
    try:
        return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except FileNotFoundError:
        return []


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except FileNotFoundError:
        return ""


def is_alive(pid: int) -> bool:
    """True while the process exists and is not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def wait_until(predicate: object, timeout: float, interval: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():  # type: ignore[operator]
            return True
        time.sleep(interval)
    return False


def api_server_pids(server: LaunchedServer) -> dict[str, int]:
    """Index -> pid of the live API servers, from the `[api-N pid]` prefix of their log lines."""
    live = set(server.child_pid("apiserver"))
    return {index: int(pid) for index, pid in re.findall(r"\[api-(\d+) (\d+)\]", server.stderr()) if int(pid) in live}


def ready_line_time(server: LaunchedServer, name: str, pid_not: int, timeout: float) -> float:
    """Seconds until the supervisor logs `name` ready with a pid other than `pid_not`."""
    pattern = re.compile(rf"{name} \(pid (\d+)\) is ready")
    started = time.monotonic()
    found = wait_until(
        lambda: any(int(pid) != pid_not for pid in pattern.findall(server.stderr())), timeout, interval=0.02
    )
    assert found, f"{name} not back within {timeout}s\n{server.log()}"
    return time.monotonic() - started


def mapped_libraries(pid: int) -> str:
    return Path(f"/proc/{pid}/maps").read_text()


class SteadyLoad:
    """Concurrent clients sending requests back to back, counting every outcome, bounded by `stop()`.

    Each client keeps one keep-alive connection (as real clients do) and remembers which API
    server answered it last, so a failure can be traced to the process its connection was on.
    """

    def __init__(self, url: str, clients: int = 8, body: dict[str, object] | None = None, path: str = "/v1/embeddings"):
        self.url = url
        self.path = path
        self.body = body or {"input": "a steady stream of short sentences"}
        self.clients = clients
        self.statuses: Counter[int] = Counter()
        # (server the client's connection was last answered by, exception type name)
        self.failures: list[tuple[str | None, str]] = []
        self.latencies: list[float] = []
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._client, daemon=True) for _ in range(clients)]

    def __enter__(self) -> SteadyLoad:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=60)

    @property
    def total(self) -> int:
        return sum(self.statuses.values()) + len(self.failures)

    def wait_for(self, count: int, timeout: float = 30) -> None:
        """Wait until at least `count` responses came back (load is really flowing)."""
        assert wait_until(lambda: sum(self.statuses.values()) >= count, timeout), f"only {self.statuses}"

    def _client(self) -> None:
        last_server: str | None = None
        with httpx.Client(base_url=self.url, timeout=60) as client:
            while not self._stop.is_set():
                started = time.perf_counter()
                try:
                    response = client.post(self.path, json=self.body)
                except httpx.HTTPError as exc:
                    with self._lock:
                        self.failures.append((last_server, type(exc).__name__))
                    continue
                last_server = response.headers.get("x-poolserve-server", last_server)
                with self._lock:
                    self.statuses[response.status_code] += 1
                    self.latencies.append(time.perf_counter() - started)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q / 100 * len(ordered)))]


PROBER = """
import json, sys, time, httpx
url, seconds = sys.argv[1], float(sys.argv[2])
latencies, statuses = [], []
with httpx.Client(base_url=url, timeout=10) as client:
    client.get('/health/live')  # the connection is made before measuring
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        started = time.perf_counter()
        statuses.append(client.get(sys.argv[3]).status_code)
        latencies.append(time.perf_counter() - started)
        time.sleep(0.01)
print(json.dumps({"latencies": latencies, "statuses": statuses}))
"""


class HealthProber:
    """Probes a health path every 10 ms from its own process, so the test's threads cannot slow it."""

    def __init__(self, url: str, seconds: float, path: str = "/health"):
        self.proc = subprocess.Popen(
            [sys.executable, "-c", PROBER, url, str(seconds), path], stdout=subprocess.PIPE, text=True
        )

    def result(self) -> tuple[list[float], list[int]]:
        out, _ = self.proc.communicate(timeout=120)
        data = json.loads(out)
        return data["latencies"], data["statuses"]


def socket_inodes(pid: int) -> set[str]:
    """Inodes of the sockets a process has open, as /proc/net/* lists them."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except FileNotFoundError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    return inodes


def runtime_dirs_of(pid: int) -> set[str]:
    """Runtime folders a process has open ipc sockets in, read from /proc/net/unix via its fds."""
    inodes = socket_inodes(pid)
    dirs = set()
    for line in Path("/proc/net/unix").read_text().splitlines()[1:]:
        fields = line.split()
        if len(fields) >= 8 and fields[6] in inodes and "poolserve-" in fields[7]:
            dirs.add(str(Path(fields[7]).parent))
    return dirs
