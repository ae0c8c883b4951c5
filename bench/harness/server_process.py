"""Servers the bench and the tests start and stop: poolserve's `launch`, the trivial server, and Infinity.

Each runs in its own session with its output in temporary files (a pipe nobody reads would
block it), polled for readiness against a deadline; `stop()` sends SIGTERM to the PID it started,
then SIGKILL to that process group if anything is left, and is safe to call twice. Also reads
each process's children, command line and memory from /proc.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Self

from bench.harness.polling import poll_until

if TYPE_CHECKING:
    import httpx

POOLSERVE_READY = re.compile(r"poolserve ready in (?P<reported>[\d.]+)s on http://(?P<host>[^:]+):(?P<port>\d+)")
TRIVIAL_READY = re.compile(r"trivial server listening on http://(?P<host>[^:]+):(?P<port>\d+)")
REPO = Path(__file__).resolve().parents[2]


class StartError(RuntimeError):
    """A server did not become ready; the message carries the tail of its output."""


class ServerProcess:
    def __init__(self, name: str, argv: Sequence[str], env: dict[str, str] | None = None, cwd: Path = REPO):
        self.name = name
        self.argv = list(argv)
        self._out = tempfile.NamedTemporaryFile(prefix=f"bench-{name}-", suffix=".out", delete=False)
        self._err = tempfile.NamedTemporaryFile(prefix=f"bench-{name}-", suffix=".err", delete=False)
        self.started_at = time.monotonic()
        self.proc = subprocess.Popen(
            self.argv,
            stdout=self._out,
            stderr=self._err,
            stdin=subprocess.DEVNULL,
            env={**os.environ, **(env or {})},
            cwd=cwd,
            start_new_session=True,
        )
        self.port = 0
        self.ready_after = 0.0
        self.is_stopped = False

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

    def output(self) -> str:
        return self.stdout() + self.stderr()

    def log(self) -> str:
        """Both streams, labelled: what a failure message shows."""
        return f"--- stdout ---\n{self.stdout()}\n--- stderr ---\n{self.stderr()}"

    def tail(self, lines: int = 30) -> str:
        return "\n".join(self.output().splitlines()[-lines:])

    def wait_for(self, is_ready: Callable[[], bool], timeout: float) -> None:

        def ready_or_exited() -> bool:
            if is_ready():
                return True
            if self.proc.poll() is not None:
                raise StartError(f"{self.name} exited with {self.proc.returncode} before ready:\n{self.tail()}")
            return False

        if not poll_until(ready_or_exited, timeout, 0.02):
            raise StartError(f"{self.name} not ready after {timeout:.0f}s:\n{self.tail()}")
        self.ready_after = time.monotonic() - self.started_at

    def wait_for_line(self, pattern: re.Pattern[str], timeout: float) -> re.Match[str]:
        found: list[re.Match[str]] = []

        def has_line() -> bool:
            match = pattern.search(Path(self._out.name).read_text(errors="replace"))
            if match:
                found.append(match)
            return match is not None

        self.wait_for(has_line, timeout)
        self.port = int(found[0]["port"])
        return found[0]

    def wait_exit(self, timeout: float = 30.0) -> int:
        """The exit code, once the process has exited by itself."""
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            raise TimeoutError(f"{self.name} did not exit within {timeout:.0f}s\n{self.log()}") from None

    def children(self) -> list[int]:
        return child_pids(self.pid)

    def child_pid(self, module: str) -> list[int]:
        """Pids of the children that run `python -m <module>` (that module, not one inside it)."""
        return [pid for pid in self.children() if module_of(cmdline(pid)) == module]

    def stop(self, grace: float = 30.0) -> None:
        if self.is_stopped:
            return
        self.is_stopped = True
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(grace)
        # Whatever is left of the group (children of a killed parent) goes too.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(5)
        for f in (self._out, self._err):
            f.close()
            with contextlib.suppress(FileNotFoundError):
                os.unlink(f.name)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


class PoolserveProcess(ServerProcess):
    """`launch --host 127.0.0.1 --port 0 ARGS`, offline, started at once (its own session, a free port, its output
    kept for failure messages); `wait_ready()` reads the port from its ready line, `client()` talks to it."""

    def __init__(self, *args: str, env: dict[str, str] | None = None, cwd: Path = REPO):
        """`cwd`: the checkout whose code runs (`python -m` puts it first on the path): another one, a
        worktree of an earlier commit, runs that commit's server."""
        argv = [sys.executable, "-m", "supervisor", "--host", "127.0.0.1", "--port", "0", *args]
        super().__init__("poolserve", argv, env={"HF_HUB_OFFLINE": "1", **(env or {})}, cwd=cwd)
        self.ready_reported = 0.0  # the start-up time the ready line itself states
        self.first_health: httpx.Response | None = None  # /health asked the moment the ready line was out

    def wait_ready(self, timeout: float = 60.0, graph: bool = True) -> Self:
        """Until the ready line is out; with `graph`, also until each engine that started without its ONNX graph
        cached has it, or failed to (engine_core/later_graph.py: torch serves meanwhile while a process exports it,
        whose CPU a measurement would count), within 300 s more."""
        match = self.wait_for_line(POOLSERVE_READY, timeout)
        self.ready_reported = float(match["reported"])
        if graph and not wait_until(lambda: self.graphs_pending() == 0, 300, interval=0.2):
            raise TimeoutError(f"an ONNX graph still exporting 300 s after the start\n{self.log()}")
        return self

    def graphs_pending(self) -> int:
        """Engines whose ONNX graph is being exported behind torch (their log lines counted)."""
        log = self.stderr()
        return log.count(GRAPH_LATER) - log.count(GRAPH_TAKES_OVER) - log.count(GRAPH_FAILED)

    def wait_ready_and_ask_health(self, timeout: float = 60.0) -> Self:
        """`wait_ready`, then /health at once: what a load balancer's first probe gets."""
        import httpx

        self.wait_ready(timeout)
        with httpx.Client(base_url=self.url, timeout=10) as client:
            self.first_health = client.get("/health")
        return self

    def client(self, **kwargs: Any) -> httpx.Client:
        import httpx

        return httpx.Client(base_url=self.url, timeout=60, **kwargs)


# engine_core/later_graph.py's lines (the harness imports no engine module).
GRAPH_LATER = "ONNX graph is not cached yet; torch serves until"
GRAPH_TAKES_OVER = "--runtime auto: the ONNX graph takes over from torch"
GRAPH_FAILED = "--runtime auto: torch serves on, the ONNX graph failed: "


def start_poolserve(args: Sequence[str], timeout: float = 300.0) -> PoolserveProcess:
    """A PoolserveProcess, returned once its ready line is out (stopped if it never is)."""
    server = PoolserveProcess(*args)
    try:
        return server.wait_ready(timeout)
    except BaseException:
        server.stop()
        raise


def start_trivial_server(reply_items: int = 0, reply_dim: int = 384, timeout: float = 30.0) -> ServerProcess:
    argv = [sys.executable, "-m", "bench.trivial_server", "--port", "0"]
    if reply_items:
        argv += ["--reply-items", str(reply_items), "--reply-dim", str(reply_dim)]
    server = ServerProcess("trivial", argv)
    try:
        server.wait_for_line(TRIVIAL_READY, timeout)
    except BaseException:
        server.stop()
        raise
    return server


def free_port() -> int:
    """A port free right now (for servers that cannot take --port 0 and say which they got)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def answers_200(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return int(response.status) == 200
    except OSError:
        return False


def start_infinity(
    infinity: Path,
    model_folder: Path,
    served_name: str,
    *,
    batch_size: int = 32,
    timeout: float = 300.0,
    dtype: str = "float32",
    engine: str = "torch",
    extra: Sequence[str] = (),
    env: dict[str, str] | None = None,
) -> ServerProcess:
    """infinity_emb v2 on loopback, its `engine` (torch at `dtype`, its --dtype; or optimum: ONNX Runtime) on the
    CPU, offline, no telemetry; `extra` flags after these."""
    port = free_port()
    argv = [
        str(infinity), "v2", "--model-id", str(model_folder), "--served-model-name", served_name,
        "--engine", engine, "--device", "cpu", "--batch-size", str(batch_size), "--dtype", dtype,
        "--host", "127.0.0.1", "--port", str(port), "--log-level", "warning", *extra,
    ]  # fmt: skip
    quiet = {"HF_HUB_OFFLINE": "1", "DO_NOT_TRACK": "1", "INFINITY_ANONYMOUS_USAGE_STATS": "0"}
    server = ServerProcess("infinity", argv, env={**quiet, **(env or {})})
    server.port = port
    try:
        server.wait_for(lambda: answers_200(f"{server.url}/health"), timeout)
    except BaseException:
        server.stop()
        raise
    return server


def wait_until(predicate: Callable[[], object], timeout: float, interval: float = 0.05) -> bool:
    """Poll `predicate` until it is true (True) or `timeout` seconds pass (False)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return False


def child_pids(pid: int) -> list[int]:
    """The direct children of `pid` (of its main thread, which is where a Python parent forks)."""
    try:
        return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except FileNotFoundError:
        return []


def process_tree(pid: int) -> list[int]:
    """`pid` and all its descendants, parents first."""
    tree = [pid]
    for parent in tree:
        for task in Path(f"/proc/{parent}/task").glob("*"):
            with contextlib.suppress(OSError):
                tree += [int(p) for p in (task / "children").read_text().split()]
    return list(dict.fromkeys(tree))


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def memory_mb(pid: int) -> dict[str, float]:
    """VmRSS (now) and VmHWM (peak) in MB, from /proc/<pid>/status."""
    values: dict[str, float] = {}
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            key, _, rest = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                values["rss_mb" if key == "VmRSS" else "peak_rss_mb"] = int(rest.split()[0]) / 1024
    except OSError:
        pass
    return values


# Each process by the module its command line runs (an engine forked from the template shows `-m engine_core` too:
# engine_core/template.py).
ROLES = {"engine_core": "engine", "engine_core.template": "engine-template", "apiserver": "apiserver",
         "supervisor": "supervisor"}  # fmt: skip


def module_of(command: str) -> str:
    """The module a `python -m <module> ...` command line runs; "" for another."""
    words = command.split()
    return words[words.index("-m") + 1] if "-m" in words[:-1] else ""


def role_of(command: str) -> str:
    return ROLES.get(module_of(command), "other")


def poolserve_memory(pid: int) -> list[dict[str, object]]:
    """Memory of every process of a running poolserve, with its role."""
    rows: list[dict[str, object]] = []
    for child in process_tree(pid):
        command = cmdline(child)
        rows.append({"pid": child, "role": role_of(command), **memory_mb(child)})
    return rows
