"""Tests that run with no other test beside them, while the suite runs over several workers (pytest-xdist, as
`make test` runs it).

A test marked `alone` holds a server to a fixed time bound (/health's p99 under overload, a probe's worst latency while
an API server tokenizes a big text): on 2 cores a neighbouring worker's test takes the CPU that bound was set without,
and such a test measured beside one failed (/health p99 62 ms against 50). Every test holds a readers-writer lock
across the workers' processes: shared for most, exclusive for an `alone` one. An exclusive request also holds the
turnstile that shared ones pass through, so it goes next instead of waiting for a gap between its neighbour's tests.
A run of `alone` tests on one worker (a parametrized one's cases) holds it from the first to the last: taken for each,
every case waited again for whatever test the other worker had started meanwhile (6-7 s each behind a schema fuzz case).

The lock lives in files named by the run's id (xdist's `testrunuid`, set by the controlling process before it starts
the workers), in a folder the controlling process makes and removes. Run without workers, nothing is locked.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

MARKER = "alone"
EXPORT_MODULE = b"engine_core.export_graph"


def lock_folder(run_id: str) -> Path:
    return Path(tempfile.gettempdir()) / f"poolserve-suite-{run_id}"


class AloneLock:
    """One worker's side of the lock: its own open files (flock's locks belong to an open file)."""

    def __init__(self, folder: Path) -> None:
        self._turnstile = os.open(folder / "turnstile", os.O_CREAT | os.O_RDWR, 0o600)
        self._room = os.open(folder / "room", os.O_CREAT | os.O_RDWR, 0o600)
        self._alone = False  # this worker holds the room exclusively, across tests

    @contextmanager
    def held(self, *, alone: bool, next_alone: bool = False) -> Iterator[None]:
        """The room for one test; `next_alone`: an `alone` test keeps it for the next, which is `alone` too."""
        if not (alone and self._alone):
            fcntl.flock(self._turnstile, fcntl.LOCK_EX)
            try:
                fcntl.flock(self._room, fcntl.LOCK_EX if alone else fcntl.LOCK_SH)
            finally:
                if not alone:
                    fcntl.flock(self._turnstile, fcntl.LOCK_UN)
            self._alone = alone
        try:
            yield
        finally:
            if not (alone and next_alone):
                fcntl.flock(self._room, fcntl.LOCK_UN)
                if alone:
                    fcntl.flock(self._turnstile, fcntl.LOCK_UN)
                self._alone = False

    def close(self) -> None:
        os.close(self._turnstile)
        os.close(self._room)


def configure(config: pytest.Config) -> None:
    """In the controlling process: name the run and make its folder. In a worker: open its side of the lock."""
    workerinput = getattr(config, "workerinput", None)
    if workerinput is not None:
        config.stash[LOCK] = AloneLock(lock_folder(workerinput["testrunuid"]))
    elif config.getoption("dist", "no") != "no":  # xdist's `-n N` sets it
        if config.option.testrunuid is None:
            config.option.testrunuid = uuid.uuid4().hex
        folder = lock_folder(config.option.testrunuid)
        folder.mkdir(exist_ok=True)
        config.stash[FOLDER] = folder


def unconfigure(config: pytest.Config) -> None:
    if lock := config.stash.get(LOCK, None):
        lock.close()
    if folder := config.stash.get(FOLDER, None):
        shutil.rmtree(folder, ignore_errors=True)


def is_alone(item: pytest.Item | None) -> bool:
    return item is not None and item.get_closest_marker(MARKER) is not None


@contextmanager
def turn(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    lock = item.config.stash.get(LOCK, None)
    if lock is None:
        yield
        return
    alone = is_alone(item)
    with lock.held(alone=alone, next_alone=is_alone(nextitem)):
        if alone:
            wait_for_exports()
        yield


def exports_running() -> bool:
    """Whether an ONNX graph's export process runs on the host (`python -m engine_core.export_graph`)."""
    for path in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if EXPORT_MODULE in path.read_bytes().split(b"\0"):
                return True
        except OSError:  # gone since the listing
            continue
    return False


def wait_for_exports(timeout: float = 180.0) -> None:
    """Until no graph export runs: one that a test started behind torch (engine_core/later_graph.py: an in-process
    load of a BERT embedder whose graph is not cached) outlives that test and would take the CPU an `alone` test's
    bound was set without (/health/live 122-125 ms against 100, three runs of five)."""
    deadline = time.monotonic() + timeout
    while exports_running() and time.monotonic() < deadline:
        time.sleep(0.2)


LOCK = pytest.StashKey[AloneLock]()
FOLDER = pytest.StashKey[Path]()
