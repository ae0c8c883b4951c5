"""The real `launch` server, started for one job on a loopback port of its own and stopped after it."""

from __future__ import annotations

import contextlib
import ctypes
import os
import re
import secrets
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from poolserve.config import API_KEY_ENV

READY = re.compile(rb"poolserve ready in [\d.]+s on http://127\.0\.0\.1:(?P<port>\d+)")
PR_SET_PDEATHSIG = 1


class ServerFailed(RuntimeError):
    """The server exited or never became ready; the message ends with the tail of its log."""


def die_with_parent() -> None:
    """Run in the child before exec: SIGTERM when the job's process dies, even by SIGKILL, so a killed job
    leaves no server behind (the supervisor then drains and cleans up as on any SIGTERM)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


class PrivateServer:
    """`python -m supervisor --host 127.0.0.1 --port 0 ARGS` with a random API key unless ARGS give one:
    another user of this machine can reach a loopback port, not the job's engines."""

    def __init__(self, launch_args: Sequence[str], api_key: str = "") -> None:
        self.api_key = api_key or secrets.token_urlsafe(24)
        # Kept when the server fails, for its log; closed by stop().
        self.log = tempfile.NamedTemporaryFile(  # noqa: SIM115
            prefix="poolserve-run-batch-", suffix=".log", delete=False
        )
        env = {**os.environ, "HF_HUB_DISABLE_PROGRESS_BARS": "1"}
        if not api_key:
            env[API_KEY_ENV] = self.api_key
        argv = [sys.executable, "-m", "supervisor", *launch_args, "--host", "127.0.0.1", "--port", "0"]
        self.proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            env=env,
            # Its own session: a Ctrl-C at the terminal reaches the job, which stops the server in order.
            start_new_session=True,
            preexec_fn=die_with_parent,  # noqa: PLW1509  # no threads exist yet in the job
        )
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def tail(self, lines: int = 20) -> str:
        return "\n".join(Path(self.log.name).read_text(errors="replace").splitlines()[-lines:])

    def wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            match = READY.search(Path(self.log.name).read_bytes())
            if match:
                self.port = int(match["port"])
                return
            if self.proc.poll() is not None:
                raise ServerFailed(f"the server exited with {self.proc.returncode} before it was ready:\n{self.tail()}")
            time.sleep(0.05)
        raise ServerFailed(f"the server was not ready after {timeout:.0f}s:\n{self.tail()}")

    def stop(self, grace: float = 30.0) -> int | None:
        """SIGTERM (the supervisor drains and stops its children), SIGKILL to the group after `grace`."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(grace)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(5)
        self.log.close()
        return self.proc.returncode

    def remove_log(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.log.name)
