"""Starting child processes (`python -m engine_core`, `python -m apiserver`) and reading their boot reports.

Children are fresh interpreters started with subprocess, not multiprocessing: their spec travels
as JSON in one environment variable and sockets travel as inherited file descriptors, so nothing
is pickled between processes.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys

import msgspec

from engine_core.boot import CHILD_SPEC_ENV, BootReport, ChildSpec, Role, encode_child_spec
from engine_core.config import API_KEY_ENV, Config


class ChildProcess:
    def __init__(self, name: str, popen: subprocess.Popen[bytes], boot_fd: int):
        self.name = name
        self.popen = popen
        self.boot_fd = boot_fd
        self.boot_report: BootReport | None = None
        self._buffer = b""

    @property
    def pid(self) -> int:
        return self.popen.pid

    @property
    def is_ready(self) -> bool:
        return self.boot_report is not None and self.boot_report.status == "ready"

    def poll(self) -> int | None:
        return self.popen.poll()

    def read_boot_report(self) -> BootReport | None:
        """Read what the child wrote on its boot pipe; the first full line is its report."""
        if self.boot_report is None:
            with contextlib.suppress(BlockingIOError):
                self._buffer += os.read(self.boot_fd, 65536)
            if b"\n" in self._buffer:
                line = self._buffer.split(b"\n", 1)[0]
                try:
                    self.boot_report = msgspec.json.decode(line, type=BootReport)
                except msgspec.DecodeError:
                    self.boot_report = BootReport(status="failed", message=f"unreadable boot report {line!r}")
        return self.boot_report

    def close_boot_pipe(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self.boot_fd)

    def send_signal(self, signum: int) -> None:
        if self.popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.popen.send_signal(signum)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def spawn_child(
    role: Role,
    config: Config,
    runtime_dir: str,
    *,
    index: int = 0,
    listener: socket.socket | None = None,
) -> ChildProcess:
    read_fd, write_fd = os.pipe()
    os.set_blocking(read_fd, False)
    listen_fd = listener.fileno() if listener is not None else -1
    spec = ChildSpec(
        role=role,
        config=config,
        runtime_dir=runtime_dir,
        boot_fd=write_fd,
        supervisor_pid=os.getpid(),
        index=index,
        listen_fd=listen_fd,
    )
    env = dict(os.environ)
    # The key reaches the API servers inside their spec; the variable it came from goes to no child.
    env.pop(API_KEY_ENV, None)
    env[CHILD_SPEC_ENV] = encode_child_spec(spec)
    if role == "api":
        # One tokenizer thread per API server: parallelism comes from running N of them.
        env.setdefault("TOKENIZERS_PARALLELISM", "false")
    module = "engine_core" if role == "engine" else "apiserver"
    pass_fds = (write_fd,) if listen_fd < 0 else (write_fd, listen_fd)
    try:
        popen = subprocess.Popen([sys.executable, "-m", module], env=env, pass_fds=pass_fds)
    finally:
        os.close(write_fd)
    return ChildProcess(spec.name, popen, read_fd)
