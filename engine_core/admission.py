"""Admission: inputs and tokens waiting or running in an engine, within its share of the server's limit.

--max-queued-inputs and --max-queued-tokens hold for a model's engines (the whole server, with one model; several
models each have their own, poolserve/served_models.py). With --engine-count M each engine admits its share (the
limit split into M parts that sum to it), and an API server whose request an engine refuses tries the other live
engines before it answers 429 (engine_client/client.py): the server then refuses only when every engine's share is
full, as one engine holding the whole limit would. One exception keeps every request the limit allows servable: an
engine holding nothing admits any request within the whole limit, though it is more than its share (the API
servers refuse larger ones with 413).
"""

from __future__ import annotations

import threading

# Requests less urgent than the default (priority > 0: bulk work, by the caller's word) are admitted
# while the queue is below this share of its limits, so urgent work finds room when bulk work has
# filled the queue: bulk gets the 429s first. On an empty queue anything that fits is admitted.
LESS_URGENT_SHARE = 0.8


def engine_share(total: int, index: int, count: int) -> int:
    """Engine `index`'s part of `total` split over `count` engines: the parts differ by at most 1 and sum to it."""
    return total // count + (1 if index < total % count else 0)


class AdmissionLimit:
    """Admitted by the I/O thread, released by the scheduler thread, hence the lock.

    `max_inputs` and `max_tokens` are this engine's share; `whole_inputs` and `whole_tokens` the server's
    limit (the share when omitted: one engine)."""

    def __init__(self, max_inputs: int, max_tokens: int, *, whole_inputs: int = 0, whole_tokens: int = 0):
        self.max_inputs = max_inputs
        self.max_tokens = max_tokens
        self.whole_inputs = whole_inputs or max_inputs
        self.whole_tokens = whole_tokens or max_tokens
        self.inputs = 0
        self.tokens = 0
        self._lock = threading.Lock()

    @classmethod
    def for_engine(cls, max_inputs: int, max_tokens: int, index: int, count: int) -> AdmissionLimit:
        """Engine `index` of `count`, under the server's limits `max_inputs` and `max_tokens`."""
        return cls(
            engine_share(max_inputs, index, count),
            engine_share(max_tokens, index, count),
            whole_inputs=max_inputs,
            whole_tokens=max_tokens,
        )

    def try_admit(self, inputs: int, tokens: int, *, force: bool = False, priority: int = 0) -> bool:
        """Take the work on unless it would pass a limit (LESS_URGENT_SHARE of it for priority > 0);
        `force` takes it regardless (resubmissions after an engine crash were admitted once already)."""
        with self._lock:
            if self.inputs == 0 and self.tokens == 0:
                fits = inputs <= self.whole_inputs and tokens <= self.whole_tokens
            else:
                share = LESS_URGENT_SHARE if priority > 0 else 1.0
                fits = (
                    self.inputs + inputs <= self.max_inputs * share and self.tokens + tokens <= self.max_tokens * share
                )
            if fits or force:
                self.inputs += inputs
                self.tokens += tokens
            return fits or force

    def release(self, inputs: int, tokens: int) -> None:
        with self._lock:
            self.inputs -= inputs
            self.tokens -= tokens
