"""prometheus_client's metric files with their disk blocks reserved before they are mapped: a full disk costs series.

In multiprocess mode every process keeps its series in files in the metrics folder, mapped into
memory and grown with truncate, which leaves them sparse. On a full filesystem (a tmpfs above
all) the first write to a page with no block behind it is a SIGBUS: the process dies, and so do
its replacements, until the supervisor gives up. Here each file's blocks are reserved with
posix_fallocate before it is mapped or grown; where there is no room, the series that do not fit
are kept in this process's memory only. They are missing from /metrics, serving goes on, the
process logs one WARNING, and poolserve_metric_series_dropped_total counts them, written to a
file of its own reserved when the process starts. Importing this module imports prometheus_client,
which picks its storage then: import it once PROMETHEUS_MULTIPROC_DIR is set.
"""

from __future__ import annotations

import contextlib
import logging
import mmap
import os
import struct

import prometheus_client.values
from prometheus_client.mmap_dict import _INITIAL_MMAP_SIZE, MmapedDict, mmap_key

logger = logging.getLogger("poolserve.metrics")

METRICS_DIR_ENV = "PROMETHEUS_MULTIPROC_DIR"
DROPPED_NAME = "poolserve_metric_series_dropped"
DROPPED_HELP = "Metric series a process kept in memory only (missing from /metrics): the metrics folder was full."


def reserve(path: str, size: int) -> OSError | None:
    """Give the file at `path` (created if absent) `size` bytes with every block allocated; the error, if not."""
    existed = os.path.exists(path)
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)  # the mode open(path, "a+b") would give it
    except OSError as exc:
        return exc
    try:
        os.posix_fallocate(fd, 0, max(size, os.fstat(fd).st_size))
    except OSError as exc:
        if not existed:  # an empty file would read as a damaged one
            with contextlib.suppress(OSError):
                os.unlink(path)
        return exc
    finally:
        os.close(fd)
    return None


def entry_bytes(key: str) -> int:
    """What MmapedDict._init_value appends for a new key: its length, the key padded to 8 bytes, two doubles."""
    encoded = key.encode("utf-8")
    return struct.calcsize(f"i{len(encoded) + 8 - (len(encoded) + 4) % 8}sdd")


class ReservedMmapedDict(MmapedDict):
    """MmapedDict that reserves blocks before mapping them. A key that finds no room lives in `in_memory`.

    Every call comes under prometheus_client's one lock of the process (values.MultiProcessValue)."""

    def __init__(self, filename: str, read_mode: bool = False, initial_bytes: int = _INITIAL_MMAP_SIZE):
        self.in_memory: dict[str, tuple[float, float]] = {}
        error = None if read_mode else reserve(filename, initial_bytes)
        if error is None:
            super().__init__(filename, read_mode)  # type: ignore[no-untyped-call]
            return
        # No file at all: every series of this one lives in memory.
        self._f = self._m = None  # type: ignore[assignment]
        self._fname = filename
        self._positions: dict[str, int] = {}
        self._capacity = self._used = 0
        self._error: OSError | None = error

    def _init_value(self, key: str) -> None:
        if self._f is None:
            self._keep_in_memory(key, self._error)
            return
        capacity = self._capacity
        while self._used + entry_bytes(key) > capacity:
            capacity *= 2
        if capacity > self._capacity and (error := reserve(self._fname, capacity)) is not None:
            self._keep_in_memory(key, error)
            return
        super()._init_value(key)  # type: ignore[no-untyped-call]  # grows to `capacity` with truncate: its blocks are already there

    def _keep_in_memory(self, key: str, error: OSError | None) -> None:
        self.in_memory[key] = (0.0, 0.0)
        DROPPED.add(self._fname, error)

    def read_value(self, key: str) -> tuple[float, float]:
        if key not in self._positions and key not in self.in_memory:
            self._init_value(key)
        if key in self.in_memory:
            return self.in_memory[key]
        return super().read_value(key)  # type: ignore[no-any-return,no-untyped-call]

    def write_value(self, key: str, value: float, timestamp: float) -> None:
        if key not in self._positions and key not in self.in_memory:
            self._init_value(key)
        if key in self.in_memory:
            self.in_memory[key] = (value, timestamp)
            return
        super().write_value(key, value, timestamp)  # type: ignore[no-untyped-call]


class DroppedSeries:
    """This process's count of series kept in memory only, as a counter in a file of its own: counting
    through prometheus_client's Counter would take its lock, which the dropping code already holds."""

    KEY = mmap_key(DROPPED_NAME, f"{DROPPED_NAME}_total", [], [], DROPPED_HELP)

    def __init__(self) -> None:
        self.count = 0
        self._file: ReservedMmapedDict | None = None

    def open(self, directory: str) -> None:
        """The counter's file, at 0 (prometheus_client reads any counter_*.db; the name keeps it apart)."""
        path = os.path.join(directory, f"counter_dropped-{os.getpid()}.db")
        self._file = ReservedMmapedDict(path, initial_bytes=mmap.PAGESIZE)  # room for its one series
        self._file.write_value(self.KEY, float(self.count), 0.0)

    def add(self, filename: str, error: OSError | None) -> None:
        self.count += 1
        if self.count == 1:
            logger.warning(
                "metrics: no room for %s (%s); new series are kept in memory and missing from /metrics, "
                "serving goes on (poolserve_metric_series_dropped_total counts them)",
                filename,
                error.strerror if error is not None and error.strerror else error,
            )
        if self._file is not None:
            self._file.write_value(self.KEY, float(self.count), 0.0)

    def close(self) -> None:
        if self._file is not None:
            self._file.close()  # type: ignore[no-untyped-call]
            self._file = None


DROPPED = DroppedSeries()


_pid = [os.getpid()]
os.register_at_fork(after_in_child=lambda: _pid.__setitem__(0, os.getpid()))


def current_pid() -> int:
    """This process's id, kept up to date across forks: prometheus_client asks for it on every write of a
    series, to notice a fork, and `os.getpid()` is a system call (~4% of an API server's CPU under load)."""
    return _pid[0]


def reserve_metric_files() -> None:
    """From here on, prometheus_client maps only reserved blocks in this process, and reads its pid from
    `current_pid`. Call it before the first metric is made: in multiprocess mode a metric opens its file when
    made (or when given labels), and a metric made before would keep the previous value class, whose own
    view of the same file the new one would not see."""
    directory = os.environ.get(METRICS_DIR_ENV)
    if not directory:
        return
    prometheus_client.values.MmapedDict = ReservedMmapedDict  # type: ignore[attr-defined]  # looked up by name each time a file is opened
    values = prometheus_client.values
    if getattr(values.ValueClass, "_multiprocess", False):  # not where prometheus_client chose in-memory values
        values.ValueClass = values.MultiProcessValue(process_identifier=current_pid)  # type: ignore[no-untyped-call]
    DROPPED.open(directory)
