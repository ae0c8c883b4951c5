"""Which engine a request goes to: the live one holding the fewest of this API server's inputs in flight."""

from __future__ import annotations

from collections.abc import Sequence


class EngineChooser:
    """Least loaded first; among equals, round robin, so that an idle server's requests alternate.

    A load is the inputs this API server has in flight on that engine, or None for an engine that is
    not there (dead, restarting, not yet ready). Counting inputs rather than requests keeps one
    request of 64 inputs from counting as much as one of a single input."""

    def __init__(self) -> None:
        self._next = 0

    def pick(self, loads: Sequence[int | None]) -> int | None:
        """The engine to send to, or None when no engine is live."""
        live = [load for load in loads if load is not None]
        if not live:
            return None
        least = min(live)
        count = len(loads)
        for step in range(count):
            index = (self._next + step) % count
            if loads[index] == least:
                self._next = index + 1
                return index
        raise AssertionError("unreachable: the least load belongs to some engine")
