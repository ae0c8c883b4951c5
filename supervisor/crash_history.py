"""How often one child has stopped unexpectedly lately: how long to wait before its restart, and when to give up."""

from __future__ import annotations

import time
from collections import deque

CRASH_WINDOW_S = 60.0
MAX_CRASHES = 5
MAX_BACKOFF_S = 10.0


class CrashHistory:
    """The first crash restarts at once; each further one within the window doubles the wait."""

    def __init__(self, window: float = CRASH_WINDOW_S, limit: int = MAX_CRASHES):
        self.window = window
        self.limit = limit
        self._times: deque[float] = deque()

    def record(self, now: float | None = None) -> int:
        """Count a crash; returns how many fell within the window, this one included."""
        now = time.monotonic() if now is None else now
        self._times.append(now)
        while self._times and self._times[0] < now - self.window:
            self._times.popleft()
        return len(self._times)

    def backoff(self, crashes: int) -> float:
        return 0.0 if crashes <= 1 else min(0.5 * 2 ** (crashes - 2), MAX_BACKOFF_S)
