"""The read clock's rules: a head in all, a body gap by gap, nothing while reading is paused."""

from __future__ import annotations

from apiserver.connection.read_timeouts import ReadClock


def test_a_new_connection_owes_its_first_head_from_the_accept_and_its_first_byte_does_not_restart_it() -> None:
    clock = ReadClock(header_timeout=60, body_timeout=30, now=100.0)
    assert clock.deadline(is_paused=False) == 160.0
    clock.head_started(now=150.0)
    assert clock.deadline(is_paused=False) == 160.0
    assert not clock.has_expired(159.9, is_paused=False)
    assert clock.has_expired(160.0, is_paused=False)


def test_a_head_sent_a_byte_at_a_time_still_runs_out_and_body_reads_do_not_move_it() -> None:
    clock = ReadClock(header_timeout=60, body_timeout=30, now=0.0)
    for second in range(1, 60):
        clock.body_read(now=float(second))  # reads while a head is owed change nothing
    assert clock.has_expired(60.0, is_paused=False)


def test_a_body_is_timed_gap_by_gap_not_as_a_whole() -> None:
    clock = ReadClock(header_timeout=60, body_timeout=30, now=0.0)
    clock.body_started(now=1.0)
    assert clock.deadline(is_paused=False) == 31.0
    for second in range(10, 200, 10):  # a slow upload that keeps coming: never expires
        clock.body_read(now=float(second))
        assert not clock.has_expired(second + 29.9, is_paused=False)
    assert clock.has_expired(190.0 + 30.0, is_paused=False)


def test_nothing_is_owed_between_a_request_and_the_next_one() -> None:
    clock = ReadClock(header_timeout=60, body_timeout=30, now=0.0)
    clock.body_started(now=1.0)
    clock.request_read()
    assert clock.deadline(is_paused=False) is None
    # The next request's first byte starts its own head clock.
    clock.head_started(now=500.0)
    assert clock.deadline(is_paused=False) == 560.0


def test_while_reading_is_paused_nothing_expires_and_resuming_gives_the_whole_time_again() -> None:
    clock = ReadClock(header_timeout=60, body_timeout=30, now=0.0)
    clock.body_started(now=1.0)
    assert clock.deadline(is_paused=True) is None
    assert not clock.has_expired(1000.0, is_paused=True)
    clock.reading_resumed(now=1000.0)
    assert clock.deadline(is_paused=False) == 1030.0


def test_a_zero_timeout_is_none() -> None:
    clock = ReadClock(header_timeout=0, body_timeout=0, now=0.0)
    assert clock.deadline(is_paused=False) is None
    clock.body_started(now=1.0)
    assert clock.deadline(is_paused=False) is None
