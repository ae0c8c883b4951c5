"""Test-only fault injection: crash or hang the engine on a marker token. Off unless tests turn it on.

Enabled only when POOLSERVE_TEST_HOOKS=1 and a marker is set (POOLSERVE_TEST_CRASH_TOKEN,
POOLSERVE_TEST_HANG_TOKEN): the fault-tolerance tests need a poison-pill input and a hung
forward pass on real processes, and nothing else may reach this.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from poolserve.boot import test_hooks_enabled

CRASH_TOKEN_ENV = "POOLSERVE_TEST_CRASH_TOKEN"
HANG_TOKEN_ENV = "POOLSERVE_TEST_HANG_TOKEN"


@dataclass(frozen=True, slots=True)
class FaultHooks:
    crash_token: int | None = None
    hang_token: int | None = None

    @classmethod
    def from_environment(cls) -> FaultHooks:
        if not test_hooks_enabled():
            return cls()
        crash, hang = os.environ.get(CRASH_TOKEN_ENV), os.environ.get(HANG_TOKEN_ENV)
        return cls(int(crash) if crash else None, int(hang) if hang else None)

    def inspect(self, rows: Sequence[npt.NDArray[np.int32]]) -> None:
        if self.crash_token is None and self.hang_token is None:
            return
        tokens = np.concatenate(rows)
        if self.crash_token is not None and np.any(tokens == self.crash_token):
            # What a segfault in a kernel looks like from outside: the process dies on a signal.
            os.kill(os.getpid(), signal.SIGSEGV)
        if self.hang_token is not None and np.any(tokens == self.hang_token):
            time.sleep(3600)
