"""What the supervisor hands a child process, and what the child reports back while it boots."""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
from typing import Literal, NamedTuple

import msgspec

from poolserve.config import Config
from poolserve.flight_record import flight_record_path

CHILD_SPEC_ENV = "POOLSERVE_CHILD_SPEC"

# Exit code of a child that could not boot (gunicorn's WORKER_BOOT_ERROR): the supervisor halts
# instead of respawning it.
EXIT_BOOT_ERROR = 3

Role = Literal["engine", "api"]


class ChildSpec(msgspec.Struct, kw_only=True, frozen=True):
    role: Role
    config: Config
    runtime_dir: str
    boot_fd: int
    supervisor_pid: int
    index: int = 0
    listen_fd: int = -1
    # API servers: the load board's memfd (apiserver/load_board.py) and this process's slot on it.
    board_fd: int = -1
    board_slot: int = 0
    # Several models (poolserve/served_models.py): every model's Config, the default (`config`) first, for an API
    # server; and every child gets each model's engine count, since an engine's `index` counts across all models'
    # engines (the first model's first), which keeps engine names, sockets and metric labels apart. Empty: one model.
    models: list[Config] = msgspec.field(default_factory=list)
    engine_counts: list[int] = msgspec.field(default_factory=list)

    @property
    def served_models(self) -> list[Config]:
        return self.models or [self.config]

    @property
    def layout(self) -> EngineLayout:
        return EngineLayout(self.engine_counts or [self.config.engine_count])

    @property
    def engine_endpoints(self) -> list[str]:
        """The default model's engines' endpoints, in engine order."""
        return self.engine_endpoints_of(0)

    def engine_endpoints_of(self, model: int) -> list[str]:
        """Model `model`'s engines' endpoints, in engine order: an API server connects to all of them."""
        layout = self.layout
        return [engine_endpoint(self.runtime_dir, index, layout.total) for index in layout.engines_of(model)]

    def flight_records_of(self, model: int) -> list[str]:
        """Model `model`'s engines' flight records, in engine order: an API server reads a dead engine's at once."""
        layout = self.layout
        return [
            flight_record_path(self.runtime_dir, child_name("engine", index, layout.total))
            for index in layout.engines_of(model)
        ]

    @property
    def name(self) -> str:
        return child_name(self.role, self.index, self.layout.total)


class EngineLayout(NamedTuple):
    """Which engines are whose: engine numbers run across the models, each model's in a block, in model order."""

    counts: list[int]

    @property
    def total(self) -> int:
        return sum(self.counts)

    def engines_of(self, model: int) -> range:
        first = sum(self.counts[:model])
        return range(first, first + self.counts[model])

    def model_of(self, engine: int) -> int:
        for model in range(len(self.counts)):
            if engine in self.engines_of(model):
                return model
        raise IndexError(f"engine {engine} of {self.total}")

    def local_index(self, engine: int) -> int:
        """The engine's place among its own model's engines."""
        return engine - self.engines_of(self.model_of(engine)).start


def child_name(role: Role, index: int, engine_count: int) -> str:
    """How logs name a child: `api-N`; `engine`, or `engine-N` when there are several."""
    if role == "api":
        return f"api-{index}"
    return "engine" if engine_count == 1 else f"engine-{index}"


class BootReport(msgspec.Struct, kw_only=True, frozen=True):
    """One line on the boot pipe: `ready`, or `failed` with a sentence saying why."""

    status: Literal["ready", "failed"]
    message: str = ""


def engine_endpoint(runtime_dir: str, index: int, engine_count: int) -> str:
    """`engine.sock` in the runtime folder, or `engine-N.sock` when there are several engines."""
    return f"ipc://{os.path.join(runtime_dir, child_name('engine', index, engine_count) + '.sock')}"


def encode_child_spec(spec: ChildSpec) -> str:
    return msgspec.json.encode(spec).decode()


def read_child_spec() -> ChildSpec:
    """The only place a child reads its spec from the environment."""
    raw = os.environ.get(CHILD_SPEC_ENV)
    if raw is None:
        raise RuntimeError(f"{CHILD_SPEC_ENV} is not set: this module is started by `launch`, not by hand.")
    return msgspec.json.decode(raw, type=ChildSpec)


def report_boot(spec: ChildSpec, report: BootReport) -> None:
    """Write one report to the supervisor; a supervisor that is gone is not an error here.

    The pipe stays open after `ready`: heartbeats follow on it, one byte each."""
    write_boot_report(spec.boot_fd, report)


def write_boot_report(boot_fd: int, report: BootReport) -> None:
    """report_boot's write, for a process with a boot pipe and no ChildSpec (the engine template)."""
    with contextlib.suppress(OSError):
        os.write(boot_fd, msgspec.json.encode(report) + b"\n")
    with contextlib.suppress(OSError):
        # Heartbeats must never block the process that beats.
        os.set_blocking(boot_fd, False)


def decode_boot_report(line: bytes) -> BootReport:
    """The supervisor's reading of a boot report line; one it cannot read is a failed boot."""
    try:
        return msgspec.json.decode(line, type=BootReport)
    except msgspec.DecodeError:
        return BootReport(status="failed", message=f"unreadable boot report {line!r}")


def describe_exit(code: int) -> str:
    """A child's exit as the logs say it, from Popen's returncode (negative: the signal that killed it)."""
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"was killed by {signal.Signals(-code).name}"
    return f"exited with code {code}"


def send_heartbeat(spec: ChildSpec) -> None:
    """One byte on the boot pipe: "still alive". A full or closed pipe is not the sender's problem."""
    with contextlib.suppress(OSError):
        os.write(spec.boot_fd, b".")


def exit_with_parent(supervisor_pid: int) -> None:
    """Ask the kernel to SIGTERM this process when the supervisor dies, so no child outlives it."""
    if sys.platform == "linux":
        pr_set_pdeathsig = 1
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(pr_set_pdeathsig, signal.SIGTERM, 0, 0, 0)
    if os.getppid() != supervisor_pid:
        # The supervisor died before the request above took effect.
        os._exit(EXIT_BOOT_ERROR)
