"""tests/alone.py's lock: an `alone` test runs with no other beside it, and does not wait behind a stream of others.
Each AloneLock opens its own files, as each worker does, so three in one process contend as three workers would."""

from __future__ import annotations

import threading
from pathlib import Path

from tests.alone import AloneLock


class Turn(threading.Thread):
    """Takes the lock in a thread of its own; `inside` is set while it holds it, until `leave` is set."""

    def __init__(self, lock: AloneLock, order: list[str], name: str, *, alone: bool, next_alone: bool = False) -> None:
        super().__init__(daemon=True)
        self.lock, self.order, self.label, self.alone, self.next_alone = lock, order, name, alone, next_alone
        self.inside = threading.Event()
        self.leave = threading.Event()

    def run(self) -> None:
        with self.lock.held(alone=self.alone, next_alone=self.next_alone):
            self.order.append(self.label)
            self.inside.set()
            self.leave.wait(10)


def test_an_alone_test_waits_for_the_running_one_and_then_goes_before_the_next(tmp_path: Path) -> None:
    locks = [AloneLock(tmp_path) for _ in range(3)]
    order: list[str] = []
    running = Turn(locks[0], order, "running", alone=False)
    alone = Turn(locks[1], order, "alone", alone=True)
    later = Turn(locks[2], order, "later", alone=False)
    try:
        running.start()
        assert running.inside.wait(5)
        alone.start()
        assert not alone.inside.wait(0.3), "an alone test ran beside another"
        later.start()
        assert not later.inside.wait(0.3), "a test went ahead of the alone one waiting"
        running.leave.set()
        assert alone.inside.wait(5)
        assert not later.inside.wait(0.3), "a test ran beside the alone one"
        alone.leave.set()
        assert later.inside.wait(5)
        later.leave.set()
        assert order == ["running", "alone", "later"]
    finally:
        for turn in (running, alone, later):
            turn.leave.set()
            if turn.ident is not None:  # started
                turn.join(5)
        for lock in locks:
            lock.close()


def test_tests_that_are_not_alone_run_side_by_side(tmp_path: Path) -> None:
    first, second = AloneLock(tmp_path), AloneLock(tmp_path)
    order: list[str] = []
    turns = [Turn(first, order, "first", alone=False), Turn(second, order, "second", alone=False)]
    try:
        for turn in turns:
            turn.start()
        assert all(turn.inside.wait(5) for turn in turns)
    finally:
        for turn in turns:
            turn.leave.set()
            turn.join(5)
        first.close()
        second.close()


def test_a_run_of_alone_tests_on_one_worker_keeps_the_room_from_the_first_to_the_last(tmp_path: Path) -> None:
    mine, other = AloneLock(tmp_path), AloneLock(tmp_path)
    order: list[str] = []
    first = Turn(mine, order, "first case", alone=True, next_alone=True)
    waiting = Turn(other, order, "other worker", alone=False)
    last = Turn(mine, order, "last case", alone=True)
    try:
        first.start()
        assert first.inside.wait(5)
        waiting.start()
        assert not waiting.inside.wait(0.3), "a test ran beside an alone one"
        first.leave.set()
        first.join(5)
        assert not waiting.inside.wait(0.3), "another worker's test went in between two alone cases"
        last.start()
        assert last.inside.wait(5), "the next alone case waited for the room it holds"
        last.leave.set()
        assert waiting.inside.wait(5), "the room stayed taken after the last alone case"
        waiting.leave.set()
        assert order == ["first case", "last case", "other worker"]
    finally:
        for turn in (first, waiting, last):
            turn.leave.set()
            if turn.ident is not None:
                turn.join(5)
        mine.close()
        other.close()
