"""How many torch threads a forward pass gets on a CPU: one for a small batch, every engine thread for a large one.

A single short input runs on two threads only 1.3x faster than on one (17 against 26 ms for a
MiniLM sentence on this project's 2-core machine), while both cores spin and wait for each other;
at one client the engine then used 1.85 cores where one thread uses 0.9 (docs/benchmarks.md, "CPU
engine"). A large batch divides well across threads: at 32 clients two threads served 110
requests/s where one served 72-78. So the thread count follows the batch's padded tokens, except
that a batch holding urgent work (a request with priority < 0: someone waits for it) gets every
thread, whatever its size.
"""

from __future__ import annotations

import torch

# A batch of at most this many padded tokens (a few short inputs) runs on one thread.
SMALL_BATCH_TOKENS = 128


class ThreadPlan:
    """Sets torch's intra-op threads before each forward pass, only when the count changes."""

    def __init__(self, device: str, threads: int):
        self.full = threads if device == "cpu" else 0
        self.current = threads

    def threads_for(self, padded_tokens: int, *, is_urgent: bool = False) -> int:
        return 1 if padded_tokens <= SMALL_BATCH_TOKENS and not is_urgent else self.full

    def apply(self, padded_tokens: int, *, is_urgent: bool = False) -> None:
        if self.full <= 1:
            return
        wanted = self.threads_for(padded_tokens, is_urgent=is_urgent)
        if wanted != self.current:
            torch.set_num_threads(wanted)
            self.current = wanted
