"""Waiting for a condition the bench reads from outside (a server's /metrics, its log, its connections)."""

from __future__ import annotations

import time
from collections.abc import Callable


def poll_until(condition: Callable[[], bool], timeout: float, interval: float = 0.05) -> bool:
    """Whether `condition` came true within `timeout` seconds, asked every `interval`. It may raise to stop early."""
    deadline = time.monotonic() + timeout
    while True:
        if condition():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval)
