"""Metric files with reserved blocks: every page mapped is allocated, and a full disk costs series, never a crash."""

from __future__ import annotations

import errno
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.mmap_dict import MmapedDict, mmap_key
from prometheus_client.multiprocess import MultiProcessCollector

from poolserve import metric_files
from poolserve.metric_files import DroppedSeries, ReservedMmapedDict, reserve_metric_files


@pytest.fixture
def dropped(monkeypatch: pytest.MonkeyPatch) -> Iterator[DroppedSeries]:
    fresh = DroppedSeries()
    monkeypatch.setattr(metric_files, "DROPPED", fresh)
    yield fresh
    fresh.close()


def key(i: int) -> str:
    return mmap_key("poolserve_test", "poolserve_test_total", ["endpoint"], [f"/path/{i:05d}" * (i % 7 + 1)], "help")


def is_fully_allocated(path: Path) -> bool:
    info = path.stat()
    return info.st_blocks * 512 >= info.st_size


def no_room(fd: int, offset: int, length: int) -> None:
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def test_a_file_is_allocated_before_it_is_mapped_and_as_it_grows(tmp_path: Path, dropped: DroppedSeries) -> None:
    path = tmp_path / "counter_1.db"
    values = ReservedMmapedDict(str(path))
    assert path.stat().st_size == 1 << 16 and is_fully_allocated(path)
    for i in range(3000):  # past 64 KiB, so it grows (doubling) several times
        values.write_value(key(i), float(i), 0.0)
        assert is_fully_allocated(path), i
    assert path.stat().st_size >= 1 << 18
    values.close()
    # prometheus_client reads it back as its own.
    read = {k: v for k, v, _, _ in MmapedDict.read_all_values_from_file(str(path))}
    assert read == {key(i): float(i) for i in range(3000)}
    assert dropped.count == 0


def test_with_no_room_for_a_file_its_series_live_in_memory_and_are_counted(
    tmp_path: Path, dropped: DroppedSeries, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    dropped.open(str(tmp_path))
    monkeypatch.setattr(os, "posix_fallocate", no_room)
    path = tmp_path / "histogram_1.db"
    values = ReservedMmapedDict(str(path))
    assert not path.exists()  # no empty file left to read as a damaged one
    for i in range(3):
        values.write_value(key(i), 2.0, 0.0)
        assert values.read_value(key(i)) == (2.0, 0.0)
    assert dropped.count == 3
    assert len([r for r in caplog.records if "no room for" in r.getMessage()]) == 1  # logged once
    (metric,) = [m for m in MultiProcessCollector.merge([str(p) for p in tmp_path.glob("*.db")])]
    assert metric.name == "poolserve_metric_series_dropped" and metric.samples[0].value == 3.0


def test_when_a_file_cannot_grow_its_series_keep_their_place_and_new_ones_stay_in_memory(
    tmp_path: Path, dropped: DroppedSeries, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "gauge_livesum_1.db"
    values = ReservedMmapedDict(str(path))
    fitted = 0
    while values._used + metric_files.entry_bytes(key(fitted)) <= values._capacity:
        values.write_value(key(fitted), 1.0, 0.0)
        fitted += 1
    monkeypatch.setattr(os, "posix_fallocate", no_room)
    values.write_value(key(fitted), 5.0, 0.0)  # needs the file to grow: no room
    values.write_value(key(0), 7.0, 0.0)  # an old series is still written to the file
    assert dropped.count == 1 and values.in_memory == {key(fitted): (5.0, 0.0)}
    assert path.stat().st_size == 1 << 16 and is_fully_allocated(path)
    values.close()
    read = {k: v for k, v, _, _ in MmapedDict.read_all_values_from_file(str(path))}
    assert len(read) == fitted and read[key(0)] == 7.0


def test_reserving_is_installed_only_in_multiprocess_mode(
    tmp_path: Path, dropped: DroppedSeries, monkeypatch: pytest.MonkeyPatch
) -> None:
    import prometheus_client.values

    monkeypatch.setattr(prometheus_client.values, "MmapedDict", MmapedDict)
    monkeypatch.delenv("PROMETHEUS_MULTIPROC_DIR", raising=False)
    reserve_metric_files()
    assert prometheus_client.values.MmapedDict is MmapedDict  # type: ignore[attr-defined]
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))
    reserve_metric_files()
    assert prometheus_client.values.MmapedDict is ReservedMmapedDict  # type: ignore[attr-defined]
    (counter,) = tmp_path.glob("counter_dropped-*.db")
    assert is_fully_allocated(counter)


def test_in_multiprocess_mode_writes_read_the_pid_once_and_a_forked_child_its_own(
    tmp_path: Path, dropped: DroppedSeries, monkeypatch: pytest.MonkeyPatch
) -> None:
    """prometheus_client asks for the pid on every write to notice a fork; `os.getpid()` is a system call."""
    import prometheus_client.values
    from prometheus_client import CollectorRegistry, Counter

    calls = []

    def getpid() -> int:
        calls.append(1)
        return os.getpid()

    monkeypatch.setattr(prometheus_client.values, "MmapedDict", MmapedDict)
    # prometheus_client's own choice at import in multiprocess mode, its pid function counted.
    monkeypatch.setattr(prometheus_client.values, "ValueClass", prometheus_client.values.MultiProcessValue(getpid))
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))
    reserve_metric_files()
    calls.clear()
    counter = Counter("poolserve_test", "help", registry=CollectorRegistry())
    counter.inc(3)
    counter.inc(4)
    assert not calls
    monkeypatch.undo()
    assert (tmp_path / f"counter_{os.getpid()}.db").exists()
    read, write = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - the child only reports
        os.write(write, b"1" if metric_files.current_pid() == os.getpid() else b"0")
        os._exit(0)
    os.waitpid(child, 0)
    assert os.read(read, 1) == b"1"
