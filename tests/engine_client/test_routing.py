from __future__ import annotations

from engine_client.routing import EngineChooser


def test_the_least_loaded_live_engine_is_chosen() -> None:
    chooser = EngineChooser()
    assert chooser.pick([5, 2, 9]) == 1
    assert chooser.pick([None, 7, 3]) == 2
    assert chooser.pick([0, None]) == 0


def test_equal_loads_take_turns() -> None:
    chooser = EngineChooser()
    assert [chooser.pick([0, 0, 0]) for _ in range(4)] == [0, 1, 2, 0]
    assert [chooser.pick([1, None, 1]) for _ in range(3)] == [2, 0, 2]


def test_no_live_engine_is_none() -> None:
    assert EngineChooser().pick([None, None]) is None
    assert EngineChooser().pick([]) is None
