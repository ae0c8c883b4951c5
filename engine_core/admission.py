"""The engine's one admission limit, shared by every API server: inputs and tokens waiting or running."""

from __future__ import annotations

import threading


class AdmissionLimit:
    """Admitted by the I/O thread, released by the scheduler thread, hence the lock."""

    def __init__(self, max_inputs: int, max_tokens: int):
        self.max_inputs = max_inputs
        self.max_tokens = max_tokens
        self.inputs = 0
        self.tokens = 0
        self._lock = threading.Lock()

    def try_admit(self, inputs: int, tokens: int, *, force: bool = False) -> bool:
        """Take the work on unless it would pass a limit; `force` takes it regardless (resubmissions
        after an engine crash were admitted once already)."""
        with self._lock:
            fits = self.inputs + inputs <= self.max_inputs and self.tokens + tokens <= self.max_tokens
            if fits or force:
                self.inputs += inputs
                self.tokens += tokens
            return fits or force

    def release(self, inputs: int, tokens: int) -> None:
        with self._lock:
            self.inputs -= inputs
            self.tokens -= tokens
