"""Starting child processes (`python -m engine_core`, `python -m apiserver`) and reading their pipes.

Children are fresh interpreters started with subprocess, not multiprocessing: their spec travels
as JSON in one environment variable and sockets travel as inherited file descriptors, so nothing
is pickled between processes. Each child writes on its pipe one boot report line, then one byte
per heartbeat.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import MappingProxyType

from poolserve.boot import (
    CHILD_SPEC_ENV,
    BootReport,
    ChildSpec,
    Role,
    child_name,
    decode_boot_report,
    encode_child_spec,
)
from poolserve.config import API_KEY_ENV, Config
from poolserve.load_board import LoadBoard
from supervisor.engine_template import AdoptedProcess, EngineTemplate

CUDA_DEVICES_ENV = "CUDA_VISIBLE_DEVICES"
# The command line each role's children run: a fresh interpreter on the role's package.
CHILD_PROGRAMS: Mapping[Role, Sequence[str]] = MappingProxyType(
    {"engine": (sys.executable, "-m", "engine_core"), "api": (sys.executable, "-m", "apiserver")}
)
# One entry per GPU the NVIDIA driver sees.
NVIDIA_GPUS_DIR = Path("/proc/driver/nvidia/gpus")


class ChildProcess:
    def __init__(
        self,
        role: Role,
        index: int,
        popen: subprocess.Popen[bytes] | AdoptedProcess,
        pipe_fd: int,
        board_slot: int = 0,
        *,
        engine_count: int = 1,
    ):
        self.role = role
        # An API server's slot on the load board (apiserver/load_board.py); 0: none.
        self.board_slot = board_slot
        self.index = index
        self.name = child_name(role, index, engine_count)
        self.popen = popen
        self.pipe_fd = pipe_fd
        self.started_at = time.monotonic()
        self.last_beat = self.started_at
        self.boot_report: BootReport | None = None
        # Told to stop (SIGTERM sent) at this time: its exit is expected, not a crash.
        self.stopped_at: float | None = None
        self._buffer = b""

    @property
    def pid(self) -> int:
        return self.popen.pid

    @property
    def forked_by(self) -> int:
        """The pid of the engine template it was forked from (supervisor/engine_template.py); 0: a fresh interpreter."""
        return self.popen.template_pid if isinstance(self.popen, AdoptedProcess) else 0

    @property
    def is_ready(self) -> bool:
        return self.boot_report is not None and self.boot_report.status == "ready"

    @property
    def has_failed_boot(self) -> bool:
        return self.boot_report is not None and self.boot_report.status == "failed"

    def poll(self) -> int | None:
        return self.popen.poll()

    def read_pipe(self) -> bool:
        """Read what the child wrote: its boot report, then heartbeats. False at end of file."""
        try:
            data = os.read(self.pipe_fd, 65536)
        except BlockingIOError:
            return True
        except OSError:
            return False
        if not data:
            return False
        self.last_beat = time.monotonic()
        if self.boot_report is None:
            self._buffer += data
            if b"\n" in self._buffer:
                line = self._buffer.split(b"\n", 1)[0]
                self._buffer = b""
                self.boot_report = decode_boot_report(line)
        return True

    def close_pipe(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self.pipe_fd)
        self.pipe_fd = -1

    def send_signal(self, signum: int) -> None:
        if self.popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.popen.send_signal(signum)

    @property
    def is_stopping(self) -> bool:
        return self.stopped_at is not None

    def stop(self) -> None:
        """Ask it to stop gracefully (an API server drains its in-flight requests first)."""
        if self.stopped_at is None:
            self.stopped_at = time.monotonic()
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def spawn_child(
    role: Role,
    config: Config,
    runtime_dir: str,
    *,
    index: int = 0,
    listener: socket.socket | None = None,
    board: LoadBoard | None = None,
    models: list[Config] | None = None,
    engine_counts: list[int] | None = None,
    gpu: str | None = None,
    program: Sequence[str] = (),
    template: EngineTemplate | None = None,
) -> ChildProcess:
    """`models`: every model's Config, for an API server of several; `engine_counts`: each model's engine count,
    with several models (poolserve/boot.py, EngineLayout); `gpu`: an engine's CUDA_VISIBLE_DEVICES (None: the
    supervisor's; supervisor/gpu_placement.py decides it); `program`: the command line it runs, the role's own in
    CHILD_PROGRAMS unless given; `template`: an engine template to fork the engine from (it starts fresh where the
    template cannot fork). Whatever it runs reads its spec from the environment and reports on the boot pipe
    (poolserve/boot.py)."""
    listen_fd = listener.fileno() if listener is not None else -1
    board_slot = board.claim_slot() if board is not None else 0

    def boot_pipe() -> tuple[int, int, ChildSpec, dict[str, str]]:
        """A new boot pipe (its read end, its write end), and the spec and environment that name it."""
        read_fd, write_fd = os.pipe()
        os.set_blocking(read_fd, False)
        spec = ChildSpec(
            role=role,
            config=config,
            runtime_dir=runtime_dir,
            boot_fd=write_fd,
            supervisor_pid=os.getpid(),
            index=index,
            listen_fd=listen_fd,
            board_fd=board.fd if board is not None else -1,
            board_slot=board_slot,
            models=models or [],
            engine_counts=engine_counts or [],
        )
        env = dict(os.environ)
        # The key reaches the API servers inside their spec; the variable it came from goes to no child.
        env.pop(API_KEY_ENV, None)
        env[CHILD_SPEC_ENV] = encode_child_spec(spec)
        if role == "api":
            # One tokenizer thread per API server: parallelism comes from running N of them.
            env.setdefault("TOKENIZERS_PARALLELISM", "false")
        elif gpu is not None:
            env[CUDA_DEVICES_ENV] = gpu
        return read_fd, write_fd, spec, env

    read_fd, write_fd, spec, env = boot_pipe()
    try:
        popen: subprocess.Popen[bytes] | AdoptedProcess | None = None
        if template is not None:
            popen = template.fork(env, write_fd)
            if popen is None:
                # A fork the template answered too late (or not at all) may still become an engine: that one keeps
                # this pipe, which nobody reads, and the supervisor stops it (reap_strays). This engine's reports
                # come on a pipe of its own.
                os.close(read_fd)
                os.close(write_fd)
                read_fd, write_fd, spec, env = boot_pipe()
        if popen is None:
            pass_fds = tuple(fd for fd in (write_fd, listen_fd, spec.board_fd) if fd >= 0)
            popen = subprocess.Popen([*(program or CHILD_PROGRAMS[role])], env=env, pass_fds=pass_fds)
    except BaseException:
        os.close(read_fd)
        if board is not None:
            board.release_slot(board_slot)
        raise
    finally:
        os.close(write_fd)
    if board is not None:
        board.set_pid(board_slot, popen.pid)
    return ChildProcess(role, index, popen, read_fd, board_slot, engine_count=spec.layout.total)


def gpu_names(visible: str | None, driver_dir: Path = NVIDIA_GPUS_DIR) -> list[str]:
    """The GPUs engines share out: the names in CUDA_VISIBLE_DEVICES or, when it is unset or empty, one
    index per GPU the NVIDIA driver lists in `driver_dir` (no torch in the supervisor); none without a driver."""
    names = [name.strip() for name in visible.split(",") if name.strip()] if visible else []
    if names:
        return names
    try:
        return [str(index) for index in range(sum(1 for _ in driver_dir.iterdir()))]
    except OSError:
        return []
