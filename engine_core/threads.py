"""How many torch threads a forward pass gets on a CPU: one for a small batch with work queued behind it, every
engine thread for a large one, or for a batch nothing waits behind.

A few short inputs run on two threads only a little faster than on one while both cores spin and wait for each
other, and on a loaded 2-core host a two-thread pass stalls whenever the API servers take its second core
(docs/benchmarks.md, "CPU engine"). A large batch divides well across threads: at 32 clients two threads served 110
requests/s where one served 72-78. So the thread count follows the batch's padded tokens, except that a batch
holding urgent work (a request with priority < 0: someone waits for it) gets every thread, and so does a batch with
nothing queued behind it: nothing else wants the cores, and with weights packed once (engine_core/packed_linear.py)
two threads answer a lone MiniLM sentence in 0.8 of one thread's time (docs/benchmarks.md, "Weights packed once"),
which is what a single client's latency is made of; two to four clients' requests paired in one pass (engine.py's
cohort hold) are such a batch too.

With more work queued than one pass takes, the engine runs two passes at once on one thread each instead
(engine.py's second lane): a two-thread pass loses 14-16 % of its rate to the API servers' 0.15 of a core on 2 cores,
as each preempted OpenMP thread holds up the other at every barrier, where two one-thread passes run 14-23 % more
inputs a second (docs/benchmarks.md, "Two passes at once").
"""

from __future__ import annotations

import torch

# A batch of at most this many padded tokens (a few short inputs) runs on one thread.
SMALL_BATCH_TOKENS = 128


class ThreadPlan:
    """Sets torch's intra-op threads before each forward pass, only when the count changes. The count is the calling
    OS thread's own once it has run torch (OpenMP's setting is per thread: torch's global value only seeds a thread's
    first use), so each thread that runs passes keeps a plan of its own (engine.py's lanes)."""

    def __init__(self, device: str, threads: int):
        self.full = threads if device == "cpu" else 0
        self.current = threads

    def threads_for(self, padded_tokens: int, *, is_urgent: bool = False, nothing_waits: bool = False) -> int:
        return 1 if padded_tokens <= SMALL_BATCH_TOKENS and not is_urgent and not nothing_waits else self.full

    def apply(self, padded_tokens: int, *, is_urgent: bool = False, nothing_waits: bool = False) -> None:
        """`nothing_waits`: no input is queued behind the batch."""
        if self.full <= 1:
            return
        self.use(self.threads_for(padded_tokens, is_urgent=is_urgent, nothing_waits=nothing_waits))

    def use(self, wanted: int) -> None:
        """`wanted` threads for this thread's next passes (on a CPU with more than one)."""
        if self.full > 1 and wanted != self.current:
            torch.set_num_threads(wanted)
            self.current = wanted
