"""The supervisor's real loop run in the test's own process, with stub children (stub_child.py) that speak the boot
pipe: restarts, back-off, giving up, scaling and rolling restarts tested in seconds, without torch.

`Supervisor.run()` installs signal handlers, so it runs in the main thread; the test's scenario runs beside it in a
thread, signals the supervisor as an operator would (`os.kill(os.getpid(), ...)`), kills stubs by pid, and reads what
happened from the stubs' events and the supervisor's log."""

from __future__ import annotations

import contextlib
import logging
import os
import re
import signal
import socket
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

# Imported before any supervisor sets PROMETHEUS_MULTIPROC_DIR in this process: prometheus_client picks its storage
# when first imported, and this test process keeps the in-memory one (its other tests make metrics too).
import prometheus_client.values
import pytest

from bench.harness.server_process import wait_until
from poolserve.config import Config
from poolserve.metric_files import DROPPED
from supervisor.arbiter import METRICS_DIR_ENV, Supervisor
from supervisor.restart_policy import RestartPolicy

STUB = Path(__file__).with_name("stub_child.py")


@dataclass(frozen=True)
class Event:
    name: str
    pid: int
    what: str  # start, ready, kill, term
    at: float  # time.monotonic(), the same clock in every process


class Run:
    """One supervisor with stub children: give orders, then `run` a scenario against it."""

    def __init__(self, folder: Path, capsys: pytest.CaptureFixture[str]):
        self.folder = folder
        self.capsys = capsys
        self.supervisor: Supervisor
        self.records: list[str] = []
        self.stdout = self.stderr = ""
        self._done = threading.Event()

    def order(self, name: str, *starts: str) -> None:
        """What child `name` does at its first, second, ... start (stub_child.py); the last line serves the rest."""
        (self.folder / name).write_text("".join(f"{line}\n" for line in starts))

    def supervise(
        self, config: Config, models: list[Config] | None = None, policy: RestartPolicy | None = None
    ) -> Supervisor:
        program = (sys.executable, str(STUB), str(self.folder))
        self.supervisor = Supervisor(
            config, models or [config], programs={"engine": program, "api": program}, restart_policy=policy
        )
        return self.supervisor

    def run(self, scenario: Callable[[Run], None] | None = None, timeout: float = 60) -> int:
        """Run the supervisor here until it exits; `scenario` beside it, after which it is stopped with SIGTERM
        (unless it stopped by itself). The supervisor's exit code; the scenario's failure, raised."""
        failure: list[BaseException] = []

        def drive() -> None:
            try:
                if scenario is not None:
                    scenario(self)
            except BaseException as exc:
                failure.append(exc)
            finally:
                if not self._done.is_set():
                    os.kill(os.getpid(), signal.SIGTERM)

        handler = logging.Handler()
        handler.emit = lambda record: self.records.append(record.getMessage())  # type: ignore[method-assign]
        logger = logging.getLogger("poolserve.supervisor")
        logger.addHandler(handler)
        level = logger.level
        logger.setLevel(logging.INFO)
        # A SIGTERM the scenario sends as the supervisor stops by itself must not end the test process.
        previous = signal.signal(signal.SIGTERM, self._ignore)
        driver = threading.Thread(target=drive, daemon=True)
        driver.start()
        try:
            code = self.supervisor.run()
        finally:
            self._done.set()
            logger.removeHandler(handler)
            logger.setLevel(level)
            driver.join(timeout)
            signal.signal(signal.SIGTERM, previous)
            captured = self.capsys.readouterr()
            self.stdout, self.stderr = captured.out, captured.err
        if failure:
            raise failure[0]
        assert not driver.is_alive(), "the scenario did not finish"
        return code

    @staticmethod
    def _ignore(signum: int, frame: FrameType | None) -> None:
        pass

    # What happened --------------------------------------------------------------------------------------------

    def events(self) -> list[Event]:
        path = self.folder / "events"
        lines = path.read_text().splitlines() if path.exists() else []
        return [Event(name, int(pid), what, float(at)) for name, pid, what, at in (line.split() for line in lines)]

    def pids(self, name: str, what: str = "start") -> list[int]:
        """The pids of child `name`'s starts (or of its other events), in order."""
        return [event.pid for event in self.events() if event.name == name and event.what == what]

    def live(self, prefix: str) -> list[int]:
        """The pids of the live children whose name starts with `prefix` (`api-`, `engine`)."""
        starts = [event for event in self.events() if event.what == "start" and event.name.startswith(prefix)]
        return sorted(event.pid for event in starts if is_stub(event.pid))

    def log(self) -> str:
        return "\n".join(self.records)

    def wait_log(self, pattern: str, timeout: float = 10, since: int = 0) -> re.Match[str]:
        """The first of the supervisor's log lines from line `since` on to match `pattern`."""
        found: list[re.Match[str]] = []

        def seen() -> bool:
            found.extend(match for line in self.records[since:] if (match := re.search(pattern, line)))
            return bool(found)

        assert wait_until(seen, timeout, interval=0.02), f"no log line matching {pattern!r}:\n{self.log()}"
        return found[0]

    def wait_started(self, timeout: float = 30) -> None:
        """Until the supervisor has started every child and printed its ready line."""
        assert wait_until(lambda: bool(self.supervisor._announced), timeout, interval=0.02), self.log()

    @property
    def is_running(self) -> bool:
        return not self._done.is_set()

    def wait_stopped(self, timeout: float = 30) -> None:
        """Until the supervisor stops by itself (the scenario sends no SIGTERM after)."""
        assert self._done.wait(timeout), f"still running after {timeout}s:\n{self.log()}"

    @property
    def port(self) -> int:
        assert self.supervisor.listener is not None
        return int(self.supervisor.listener.getsockname()[1])

    def ask(self) -> str:
        """One request on the shared socket; the body names the API server that answered."""
        with socket.create_connection(("127.0.0.1", self.port), timeout=10) as connection:
            connection.sendall(b"GET / HTTP/1.1\r\nHost: stub\r\n\r\n")
            reply = b""
            while chunk := connection.recv(4096):
                reply += chunk
        return reply.split(b"\r\n\r\n", 1)[1].decode()


def is_stub(pid: int) -> bool:
    """True while `pid` is a stub child that runs (not a zombie, and not another process that took its pid)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        command = Path(f"/proc/{pid}/cmdline").read_bytes()
    except (FileNotFoundError, ProcessLookupError):
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z" and str(STUB).encode() in command


@contextlib.contextmanager
def stub_run(folder: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> Iterator[Run]:
    """A Run whose supervisor keeps its runtime folder under `folder` and leaves this process as it found it: the
    metrics variable, prometheus_client's file class, and no stub left running."""
    monkeypatch.setattr(tempfile, "tempdir", str(folder))
    # Set, then removed: monkeypatch then removes the supervisor's value at the end (a bare delenv of a variable that
    # is not set records nothing to undo, and the next process this one starts would inherit a deleted folder).
    monkeypatch.setenv(METRICS_DIR_ENV, "")
    monkeypatch.delenv(METRICS_DIR_ENV)
    monkeypatch.setattr(prometheus_client.values, "MmapedDict", vars(prometheus_client.values)["MmapedDict"])
    monkeypatch.setattr(prometheus_client.values, "ValueClass", prometheus_client.values.ValueClass)
    orders = folder / "orders"
    orders.mkdir()
    run = Run(orders, capsys)
    try:
        yield run
    finally:
        DROPPED.close()
        for event in run.events():
            if is_stub(event.pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(event.pid, signal.SIGKILL)
