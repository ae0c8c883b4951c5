"""The supervisor's side of the engine template (engine_core/template.py): start it, fork engines from it, reap them.

The template saves each engine on the CPU its imports (~4.5-6 s of CPU on a 2-core host), at start and at every
restart. It is an accelerator only: where it cannot fork (not started yet, failed to import, gone, too slow to
answer), the engine starts as a fresh interpreter, as it always could. Its engines are adopted by this process (a
child subreaper, set before the first fork) and are then its children like the others: reaped with waitpid,
signalled by pid, in the supervisor's process group.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import logging
import os
import select
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import msgspec

from poolserve.boot import BootReport, decode_boot_report
from poolserve.config import API_KEY_ENV, Config
from poolserve.engine_template import TEMPLATE_SPEC_ENV, ForkReply, ForkRequest, TemplateSpec

logger = logging.getLogger("poolserve.supervisor")

TEMPLATE_PROGRAM = (sys.executable, "-m", "engine_core.template")
# A fork and its reply take ~10-50 ms (the page tables of a ~0.5 GB process, copied twice). The supervisor's loop
# waits for the answer, so a template that has not answered by then (stopped, stuck) is taken for broken: replaced,
# and the engine starts fresh.
FORK_TIMEOUT_S = 3.0
# A template lost this many times (it exited, or stopped answering) is not started again: engines start fresh.
MAX_LOSSES = 3
PR_SET_CHILD_SUBREAPER = 36

_request_encoder = msgspec.json.Encoder()
_reply_decoder = msgspec.json.Decoder(ForkReply)


def become_subreaper() -> bool:
    """Make this process the one the kernel hands orphaned descendants to (the template's engines among them)."""
    if sys.platform != "linux":
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    return bool(libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0)


def child_pids() -> set[int]:
    """This process's children, as the kernel lists them (each thread's own)."""
    pids: set[int] = set()
    for task in Path("/proc/self/task").iterdir():
        with contextlib.suppress(OSError):
            pids.update(int(pid) for pid in (task / "children").read_text().split())
    return pids


def runs_engine_code(pid: int) -> bool:
    """Whether `pid` runs `python -m engine_core` or `-m engine_core.template` (an engine, or a first child of the
    template about to fork one)."""
    try:
        words = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").split()
    except OSError:
        return False
    return b"-m" in words[:-1] and words[words.index(b"-m") + 1] in (b"engine_core", b"engine_core.template")


def reap_strays(known: set[int]) -> list[int]:
    """The children this process did not start and does not manage, which the kernel hands it as a subreaper: an
    engine a template forked after it was given up on (it would take its place's socket) is killed; whatever has
    exited is reaped, so no zombie stays. Other orphans (what a dead engine left running) are left to end on their
    own. Returns the pids reaped."""
    for pid in child_pids() - known:
        if runs_engine_code(pid):
            logger.warning("pid %d, an engine the supervisor gave up on, is stopped", pid)
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    reaped: list[int] = []
    while True:
        try:
            # Looked at, not reaped: an exited child this process knows is reaped where it is known (its Popen).
            exited = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            break
        if exited is None or exited.si_pid in known:
            break
        os.waitpid(exited.si_pid, 0)
        reaped.append(exited.si_pid)
    return reaped


class AdoptedProcess:
    """An engine the template forked and this process adopted: polled, waited for and signalled as a Popen is."""

    def __init__(self, pid: int, template_pid: int) -> None:
        self.pid = pid
        self.template_pid = template_pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:
                # Not this process's child after all: its exit cannot be read here, only that it is gone.
                try:
                    os.kill(self.pid, 0)
                except ProcessLookupError:
                    self.returncode = 255
            else:
                if pid:
                    self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while (code := self.poll()) is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(f"pid {self.pid}", timeout or 0.0)
            time.sleep(0.01)
        return code

    def send_signal(self, signum: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, signum)


class EngineTemplate:
    def __init__(self, config: Config, program: Sequence[str] = TEMPLATE_PROGRAM):
        """`program`: the command line it runs (what reads a TemplateSpec and answers ForkRequests)."""
        self.config = config
        self.program = tuple(program)
        self.process: subprocess.Popen[bytes] | None = None
        self.control: socket.socket | None = None
        self.pipe_fd = -1
        self.report: BootReport | None = None
        self.losses = 0
        self.base_env: dict[str, str] = {}
        # Why engines no longer come from a template (it could not import, or was lost too often); "" while they do.
        self.disabled = ""
        self._buffer = b""

    @property
    def pid(self) -> int:
        return self.process.pid if self.process is not None else 0

    def start(self) -> None:
        """Start it importing (the supervisor's start waits for it: wait_ready)."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        read_fd, write_fd = os.pipe()
        spec = TemplateSpec(
            boot_fd=write_fd,
            control_fd=theirs.fileno(),
            supervisor_pid=os.getpid(),
            log_level=self.config.log_level,
            log_format=self.config.log_format,
        )
        env = dict(os.environ)
        env.pop(API_KEY_ENV, None)
        # What each engine's environment is sent as a difference from (ForkRequest).
        self.base_env = dict(env)
        env[TEMPLATE_SPEC_ENV] = msgspec.json.encode(spec).decode()
        try:
            self.process = subprocess.Popen(self.program, env=env, pass_fds=(write_fd, theirs.fileno()))
        except OSError as exc:
            ours.close()
            os.close(read_fd)
            self.disabled = f"it could not be started ({exc})"
            return
        finally:
            os.close(write_fd)
            theirs.close()
        self.control, self.pipe_fd = ours, read_fd
        self.report, self._buffer = None, b""

    def wait_ready(self, timeout: float) -> bool:
        """Read its boot report, waiting at most `timeout` seconds for it; True while it can fork."""
        deadline = time.monotonic() + timeout
        while self.report is None and self.pipe_fd >= 0:
            remaining = deadline - time.monotonic()
            readable, _, _ = select.select([self.pipe_fd], [], [], max(0.0, remaining))
            if not readable:
                if remaining <= 0:
                    break
                continue
            data = os.read(self.pipe_fd, 4096)
            if not data:
                self._lose("exited while importing")
                break
            self._buffer += data
            if b"\n" in self._buffer:
                self.report = decode_boot_report(self._buffer.split(b"\n", 1)[0])
                if self.report.status == "ready":
                    logger.info(
                        "engine-template (pid %d) is ready (%s): engines on the CPU are forked from it",
                        self.pid,
                        self.report.message,
                    )
                else:
                    self.stop()  # reaped: it exits after a failed report
                    self.disabled = self.report.message
                    logger.warning("engine-template: %s; engines start as fresh interpreters", self.disabled)
        return self.report is not None and self.report.status == "ready" and not self.disabled

    def poll(self) -> None:
        """From the supervisor's loop, without waiting: read its boot report when it comes, and replace it when it has
        died, so that the next engine finds one ready."""
        if self.disabled or self.process is None:
            return
        if self.process.poll() is not None:
            self._lose("exited")
        elif self.report is None:
            self.wait_ready(0)

    @property
    def is_importing(self) -> bool:
        """Started, not yet reported, and not known to be gone."""
        return not self.disabled and self.report is None and self.pipe_fd >= 0

    def fork(self, env: dict[str, str], boot_fd: int) -> AdoptedProcess | None:
        """An engine with this environment and boot pipe, forked and adopted; None where the caller must start it
        fresh (a template still importing included: it is of use to the next engine, not to this one)."""
        if self.disabled:
            return None
        if self.process is None or self.process.poll() is not None:
            self._lose("exited")
            return None
        if not self.wait_ready(0) or self.control is None:
            return None
        request = _request_encoder.encode(ForkRequest.between(self.base_env, env))
        try:
            socket.send_fds(self.control, [request], [boot_fd])
        except OSError as exc:
            if exc.errno == errno.EMSGSIZE:  # this engine's environment, not the template, is at fault
                logger.warning("engine-template: an environment of %d bytes does not fit; the engine starts fresh",
                               len(request))  # fmt: skip
                return None
            self._lose(f"failed to fork: {exc}")
            return None
        try:
            readable, _, _ = select.select([self.control], [], [], FORK_TIMEOUT_S)
            if not readable:
                raise TimeoutError(f"no answer in {FORK_TIMEOUT_S:.0f}s")
            reply = _reply_decoder.decode(self.control.recv(65536))
        except (OSError, msgspec.DecodeError) as exc:
            self._lose(f"failed to fork: {exc}")
            return None
        if reply.error:
            logger.warning("engine-template could not fork (%s); the engine starts as a fresh interpreter", reply.error)
            return None
        return AdoptedProcess(reply.pid, self.pid)

    def _lose(self, why: str) -> None:
        """It is gone or broken: stopped, and started again unless that has happened too often."""
        why = f"(pid {self.pid}) {why}"
        self.stop()
        self.losses += 1
        if self.losses >= MAX_LOSSES:
            self.disabled = f"lost {self.losses} times (last: {why})"
            logger.warning("engine-template %s; engines start as fresh interpreters from now on", self.disabled)
            return
        logger.warning("engine-template %s; the next engine starts as a fresh interpreter while a new one imports", why)
        self.start()

    def _close(self) -> None:
        if self.control is not None:
            self.control.close()
            self.control = None
        if self.pipe_fd >= 0:
            os.close(self.pipe_fd)
            self.pipe_fd = -1

    def stop(self) -> None:
        """Killed at once: it holds nothing to finish or drain, and one that is stuck or stopped (SIGSTOP) would keep
        a SIGTERM waiting while the supervisor's loop waits for it."""
        self._close()
        process, self.process = self.process, None
        if process is not None:
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            process.wait()
