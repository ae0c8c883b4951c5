"""The engine's one admission limit, shared by every API server: inputs and tokens waiting or running."""

from __future__ import annotations

import threading

# Requests less urgent than the default (priority > 0: bulk work, by the caller's word) are admitted
# while the queue is below this share of its limits, so urgent work finds room when bulk work has
# filled the queue: bulk gets the 429s first. On an empty queue anything that fits is admitted.
LESS_URGENT_SHARE = 0.8


class AdmissionLimit:
    """Admitted by the I/O thread, released by the scheduler thread, hence the lock."""

    def __init__(self, max_inputs: int, max_tokens: int):
        self.max_inputs = max_inputs
        self.max_tokens = max_tokens
        self.inputs = 0
        self.tokens = 0
        self._lock = threading.Lock()

    def try_admit(self, inputs: int, tokens: int, *, force: bool = False, priority: int = 0) -> bool:
        """Take the work on unless it would pass a limit (LESS_URGENT_SHARE of it for priority > 0);
        `force` takes it regardless (resubmissions after an engine crash were admitted once already)."""
        share = LESS_URGENT_SHARE if priority > 0 else 1.0
        with self._lock:
            if self.inputs == 0 and self.tokens == 0:
                share = 1.0
            fits = self.inputs + inputs <= self.max_inputs * share and self.tokens + tokens <= self.max_tokens * share
            if fits or force:
                self.inputs += inputs
                self.tokens += tokens
            return fits or force

    def release(self, inputs: int, tokens: int) -> None:
        with self._lock:
            self.inputs -= inputs
            self.tokens -= tokens
