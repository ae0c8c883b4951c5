"""What one more forward pass costs, in tokens' worth of compute, refitted from the passes served.

The scheduler cuts each window of waiting inputs into batches by weighing a pass's fixed cost against
the padding a cut saves (engine_core/scheduler.py). The loader measures that cost once at start-up,
from two batch shapes (engine_core/loader.py): a few milliseconds of timing that swings from start to
start (13 to 42 tokens for the bundled model on 2 cores) and sees a bare forward pass, not the passes
the server runs. So the engine also fits `seconds = fixed + per_token x padded tokens` over the text
passes it serves, weighted toward the latest (each pass's weight decays by DECAY per pass), and every
REFIT_EVERY passes hands the scheduler `fixed / per_token`, when the passes' sizes spread enough for
a slope to mean something. As at start-up, a fit that sees no per-token cost answers the cap.
"""

from __future__ import annotations

# Each pass's weight shrinks by this much per later pass: the fit follows the last ~50 passes.
DECAY = 0.98
REFIT_EVERY = 32
# The padded tokens of the passes must vary this much (standard deviation over mean) for a fit.
MIN_SPREAD = 0.25


class PassCostFit:
    def __init__(self, cap: float):
        self.cap = cap
        self.passes = 0
        self._w = self._x = self._y = self._xx = self._xy = 0.0

    def observe(self, tokens: int, seconds: float) -> float | None:
        """Count one pass; every REFIT_EVERY passes, the fixed cost in tokens the passes show, or None
        when they do not say (too alike in size)."""
        self._w = self._w * DECAY + 1.0
        self._x = self._x * DECAY + tokens
        self._y = self._y * DECAY + seconds
        self._xx = self._xx * DECAY + tokens * tokens
        self._xy = self._xy * DECAY + tokens * seconds
        self.passes += 1
        if self.passes % REFIT_EVERY:
            return None
        return self.fixed_tokens()

    def fixed_tokens(self) -> float | None:
        if self._w == 0:
            return None
        mean_x, mean_y = self._x / self._w, self._y / self._w
        variance = self._xx / self._w - mean_x * mean_x
        if variance <= (MIN_SPREAD * mean_x) ** 2:
            return None
        per_token = (self._xy / self._w - mean_x * mean_y) / variance
        if per_token <= 0:
            return self.cap
        return min(self.cap, max(0.0, (mean_y - per_token * mean_x) / per_token))
