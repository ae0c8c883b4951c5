"""poolserve/collector.py: what a server process does to the garbage collector once started."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from poolserve.collector import YOUNG_THRESHOLD, settle


@pytest.fixture
def restored() -> Iterator[None]:
    """The test process's collector as it was, afterwards: frozen again if it was (tests/conftest.py settles it)."""
    threshold = gc.get_threshold()
    was_frozen = gc.get_freeze_count() > 0
    try:
        yield
    finally:
        gc.unfreeze()
        if was_frozen:
            gc.freeze()
        gc.set_threshold(*threshold)


class Knot:
    """An object in a reference cycle with itself: only the collector frees it."""

    def __init__(self) -> None:
        self.me = self


def test_settle_frees_startups_cycles_freezes_the_rest_and_raises_the_young_threshold(restored: None) -> None:
    knot = Knot()
    freed = weakref.ref(knot)
    kept = [object()]
    del knot
    settle()
    assert freed() is None, "start-up's garbage was frozen with the rest, not freed"
    # Frozen: in no generation, so no collection walks it.
    assert gc.get_freeze_count() > 0 and all(found is not kept for found in gc.get_objects())
    assert gc.get_threshold()[0] == YOUNG_THRESHOLD
