"""What the supervisor does about a child that stopped unexpectedly: restart it (at once, or after a back-off), take
an engine out of service for a while, or give up. A pure function of the child's crash history and of who else is
up; the arbiter keeps the history and carries the decision out."""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

CRASH_WINDOW_S = 60.0
MAX_CRASHES = 5
FIRST_BACKOFF_S = 0.5
MAX_BACKOFF_S = 10.0
# With several engines, one that crashes more than the policy allows is left stopped this long (then given a fresh
# start) while the others serve, rather than the whole server giving up.
OUT_OF_SERVICE_S = 300.0


class Others(enum.Enum):
    """Who else can serve while a crashed engine cannot: another engine of its own model, or only another model's
    engine, or nobody (an API server's siblings do not count: they serve the same as it)."""

    OWN_MODEL = "own model"
    OTHER_MODELS = "other models"
    NONE = "none"


class Restart(NamedTuple):
    """Start it again `after` seconds from now; `crashes`: how many fell within the window, this one included."""

    after: float
    crashes: int


class TakeOutOfService(NamedTuple):
    """Leave the engine stopped `seconds` (the others serve), forget its crashes, then start it afresh."""

    seconds: float
    crashes: int
    others: Others


class GiveUp(NamedTuple):
    """It crashes too often and nobody else can serve: stop everything."""

    crashes: int


Decision = Restart | TakeOutOfService | GiveUp


@dataclass(frozen=True)
class RestartPolicy:
    """The first crash restarts at once; each further one within `window` seconds doubles the wait, from
    `first_backoff` up to `max_backoff`; past `limit` crashes within the window an engine beside others that are up
    is taken out of service for `out_of_service` seconds, and anything else makes the supervisor give up."""

    window: float = CRASH_WINDOW_S
    limit: int = MAX_CRASHES
    first_backoff: float = FIRST_BACKOFF_S
    max_backoff: float = MAX_BACKOFF_S
    out_of_service: float = OUT_OF_SERVICE_S

    def recent(self, crashes: Sequence[float], now: float) -> list[float]:
        """The crash times (monotonic seconds) that still count at `now`: the history worth keeping."""
        return [when for when in crashes if when >= now - self.window]

    def backoff(self, crashes: int) -> float:
        return 0.0 if crashes <= 1 else min(self.first_backoff * 2 ** (crashes - 2), self.max_backoff)

    def decide(self, crashes: Sequence[float], now: float, *, is_engine: bool, others: Others) -> Decision:
        """`crashes`: the child's crash times, the one that happened at `now` included."""
        count = len(self.recent(crashes, now))
        if count <= self.limit:
            return Restart(self.backoff(count), count)
        if is_engine and others is not Others.NONE:
            return TakeOutOfService(self.out_of_service, count, others)
        return GiveUp(count)
