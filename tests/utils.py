"""What the end-to-end tests add to the bench's harness (bench/server_process.py): a launcher with the
tests' environment, /proc readers, and steady load that counts every outcome."""

from __future__ import annotations

import os
import re
import threading
import time
from collections import Counter
from pathlib import Path

import httpx

from bench.server_process import PoolserveProcess, wait_until


class LaunchedServer(PoolserveProcess):
    """The bench's `launch` process (its own session, a free port, its output kept for failure
    messages), given its flags as arguments, with an HTTP client."""

    def __init__(self, *args: str, env: dict[str, str] | None = None):
        super().__init__(args, env=env)

    def client(self, **kwargs: object) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=60, **kwargs)  # type: ignore[arg-type]


def is_alive(pid: int) -> bool:
    """True while the process exists and is not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


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
