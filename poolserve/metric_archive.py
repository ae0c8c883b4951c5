"""A dead process's metric files folded into one archive file per kind, then removed.

In multiprocess mode every process writes its series to files named by its pid, and every scrape parses
every file in the folder. The files of processes that died stay (prometheus_client removes only their
`live*` gauges): after restarts and SIGHUPs the folder grows (17 files to 86 after 10 SIGHUPs and 3 engine
kills) and so does each scrape's work on an API server's event loop (12 to 32 ms). The supervisor, which
reaps every child, folds a dead child's counters, histograms and summaries into `<kind>_archive.db` (summed,
so every total stays what it was) and its `sum`/`max`/`min`/`mostrecent` gauges likewise by their own rule,
drops its `all` gauges (per-pid values of a process that is gone), and removes its files.

A scrape reading the folder while a file is folded would count it twice (or not at all): folding holds an
exclusive lock on the folder's lock file, and every scrape holds it shared while it reads.
"""

from __future__ import annotations

import contextlib
import fcntl
import glob
import logging
import os
import struct
from collections.abc import Iterator

from prometheus_client.mmap_dict import _INITIAL_MMAP_SIZE, MmapedDict

from poolserve.metric_files import ReservedMmapedDict, entry_bytes, reserve

logger = logging.getLogger("poolserve.metrics")

LOCK_NAME = ".fold.lock"
ARCHIVE = "archive"
SUMMED = ("counter", "histogram", "summary")
GAUGE_RULES = {"sum": "sum", "max": "max", "min": "min", "mostrecent": "mostrecent"}


@contextlib.contextmanager
def folder_lock(directory: str, *, exclusive: bool) -> Iterator[None]:
    """The folder's lock: exclusive while files are folded, shared while a scrape reads them."""
    fd = os.open(os.path.join(directory, LOCK_NAME), os.O_RDWR | os.O_CREAT, 0o666)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        yield
    finally:
        os.close(fd)  # closing releases the lock


def files_of(directory: str, pid: int) -> list[str]:
    """The metric files a process wrote: prometheus_client's `<kind>_<pid>.db` (gauges `gauge_<mode>_<pid>.db`)
    and poolserve's `counter_dropped-<pid>.db` (poolserve/metric_files.py)."""
    return [
        *glob.glob(os.path.join(directory, f"*_{pid}.db")),
        *glob.glob(os.path.join(directory, f"*-{pid}.db")),
    ]


def fold_dead_files(directory: str, pid: int) -> int:
    """Fold the dead process `pid`'s files into the archives and remove them; how many files went. A file that
    does not parse (torn by the death) is left where it is: scrapes already leave it out."""
    folded = 0
    with folder_lock(directory, exclusive=True):
        for path in files_of(directory, pid):
            parts = os.path.basename(path)[: -len(".db")].split("_")
            kind = parts[0]
            try:
                values = list(MmapedDict.read_all_values_from_file(path))  # type: ignore[no-untyped-call]
            except Exception as exc:
                logger.warning("metrics: left %s of dead pid %d, which does not parse: %r", path, pid, exc)
                continue
            target = None
            if kind in SUMMED:
                target, rule = os.path.join(directory, f"{kind}_{ARCHIVE}.db"), "sum"
            elif kind == "gauge" and len(parts) > 1 and parts[1] in GAUGE_RULES:
                target, rule = os.path.join(directory, f"gauge_{parts[1]}_{ARCHIVE}.db"), GAUGE_RULES[parts[1]]
            if target is not None:
                error = reserve_room(target, values)
                if error is not None:  # a full folder: the file stays, counted as it was
                    logger.warning("metrics: no room to fold %s of dead pid %d: %s", path, pid, error)
                    continue
                fold(target, values, rule)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
            folded += 1
    return folded


def reserve_room(archive_path: str, values: list[tuple[str, float, float, int]]) -> OSError | None:
    """The archive's blocks for every key it may gain, allocated before it is mapped and grown (doubling, as
    prometheus_client grows it): folding never writes to a block the filesystem has not given."""
    size = os.path.getsize(archive_path) if os.path.exists(archive_path) else 0
    # What the archive holds is what its header says it uses, not its size: its size is what was reserved (a
    # power of two), and growing from the size doubled the file at every fold (64 GB after ~20 restarts).
    needed = used_bytes(archive_path, size) + sum(entry_bytes(key) for key, *_ in values)
    capacity = max(size, _INITIAL_MMAP_SIZE)
    while capacity < needed:
        capacity *= 2
    return reserve(archive_path, capacity)


def used_bytes(path: str, size: int) -> int:
    """The bytes a MmapedDict file uses: its header's first int (8 for a file with no entries)."""
    if size < 8:
        return 8
    with open(path, "rb") as file:
        used: int = struct.unpack("i", file.read(4))[0]
    return used


def fold(archive_path: str, values: list[tuple[str, float, float, int]], rule: str) -> None:
    archive = ReservedMmapedDict(archive_path)
    try:
        for key, value, timestamp, _ in values:
            is_new = key not in archive._positions  # MmapedDict keeps no other record of its keys
            old, old_timestamp = archive.read_value(key)
            if rule == "sum":
                new, when = old + value, max(old_timestamp, timestamp)
            elif rule == "max":
                new, when = (value if is_new else max(old, value)), max(old_timestamp, timestamp)
            elif rule == "min":
                new, when = (value if is_new else min(old, value)), max(old_timestamp, timestamp)
            else:  # mostrecent
                new, when = (value, timestamp) if timestamp >= old_timestamp else (old, old_timestamp)
            archive.write_value(key, new, when)
    finally:
        archive.close()  # type: ignore[no-untyped-call]
