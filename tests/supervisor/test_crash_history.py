from __future__ import annotations

from supervisor.crash_history import MAX_BACKOFF_S, CrashHistory


def test_the_first_crash_restarts_at_once_and_later_ones_back_off() -> None:
    history = CrashHistory(window=60, limit=5)
    delays = [history.backoff(history.record(now=float(t))) for t in range(5)]
    assert delays == [0.0, 0.5, 1.0, 2.0, 4.0]
    assert history.backoff(20) == MAX_BACKOFF_S


def test_crashes_outside_the_window_are_forgotten() -> None:
    history = CrashHistory(window=10, limit=5)
    assert [history.record(now=t) for t in (0.0, 1.0, 2.0)] == [1, 2, 3]
    assert history.record(now=11.5) == 2  # the ones at 0 and 1 fell out of the window
    assert history.record(now=100.0) == 1
