"""A dead process's metric files are folded into the archives and removed: the totals a scrape reads stay what
they were, and the folder stays the size of the live processes."""

from __future__ import annotations

import json
import os
from pathlib import Path

from prometheus_client.mmap_dict import _INITIAL_MMAP_SIZE, MmapedDict, mmap_key
from prometheus_client.multiprocess import MultiProcessCollector

from poolserve.metric_archive import fold_dead_files


def write(directory: Path, name: str, series: dict[tuple[str, str, str], tuple[float, float]]) -> None:
    """`series`: (metric, sample, label value) -> (value, timestamp), written as prometheus_client writes them."""
    mmap_dict = MmapedDict(str(directory / name))  # type: ignore[no-untyped-call]
    for (metric, sample, label), (value, timestamp) in series.items():
        mmap_dict.write_value(mmap_key(metric, sample, ["endpoint"], [label], "help"), value, timestamp)  # type: ignore[no-untyped-call]
    mmap_dict.close()  # type: ignore[no-untyped-call]


def scrape(directory: Path) -> dict[str, float]:
    collected = MultiProcessCollector.merge([str(p) for p in directory.glob("*.db")], accumulate=True)  # type: ignore[no-untyped-call]
    return {
        json.dumps([sample.name, sample.labels], sort_keys=True): sample.value
        for metric in collected
        for sample in metric.samples
    }


def test_folding_dead_processes_keeps_every_total_and_removes_their_files(tmp_path: Path) -> None:
    for pid, requests, seconds in ((101, 3.0, 0.25), (202, 4.0, 0.5), (303, 10.0, 1.0)):
        write(tmp_path, f"counter_{pid}.db", {("poolserve_requests", "poolserve_requests_total", "/v1"): (requests, 0)})
        write(tmp_path, f"histogram_{pid}.db", {
            ("poolserve_request_seconds", "poolserve_request_seconds_bucket", "/v1"): (requests, 0),
            ("poolserve_request_seconds", "poolserve_request_seconds_sum", "/v1"): (seconds, 0),
        })  # fmt: skip
        write(tmp_path, f"gauge_max_{pid}.db", {("poolserve_peak", "poolserve_peak", "/v1"): (requests, 0)})
        write(tmp_path, f"gauge_all_{pid}.db", {("poolserve_state", "poolserve_state", "/v1"): (1.0, 0)})
    write(tmp_path, "counter_dropped-101.db", {("poolserve_dropped", "poolserve_dropped_total", "-"): (2.0, 0)})
    before = scrape(tmp_path)
    assert fold_dead_files(str(tmp_path), 101) == 5
    assert fold_dead_files(str(tmp_path), 202) == 4
    after = scrape(tmp_path)
    # The 'all' gauges of the dead (one series per pid) are gone; everything else reads as it did.
    gone = {key for key in before if '"pid": "101"' in key or '"pid": "202"' in key}
    assert gone and set(after) == set(before) - gone
    assert all(after[key] == before[key] for key in after)
    names = sorted(os.listdir(tmp_path))
    assert not [name for name in names if "101" in name or "202" in name]
    assert "counter_archive.db" in names and "gauge_max_archive.db" in names
    # The live process's files are untouched, and its values still add up with the archive's.
    assert "counter_303.db" in names
    assert after[json.dumps(["poolserve_requests_total", {"endpoint": "/v1"}], sort_keys=True)] == 17.0


def test_a_file_torn_by_the_death_is_left_for_scrapes_to_skip(tmp_path: Path) -> None:
    (tmp_path / "counter_404.db").write_bytes(b"\x10\x00\x00\x00garbage")
    assert fold_dead_files(str(tmp_path), 404) == 0
    assert (tmp_path / "counter_404.db").exists()


def test_the_archive_grows_with_its_series_not_with_the_deaths_folded(tmp_path: Path) -> None:
    """Restarts of processes with the same series: the archive keeps one entry per series, and its file stays the
    first size it was given (it used to double at every fold: 61 GB after a soak's restarts; a few folds show it)."""
    for pid in range(1000, 1006):
        write(tmp_path, f"counter_{pid}.db", {("poolserve_requests", "poolserve_requests_total", "/v1"): (1.0, 0)})
        assert fold_dead_files(str(tmp_path), pid) == 1
    total = scrape(tmp_path)[json.dumps(["poolserve_requests_total", {"endpoint": "/v1"}], sort_keys=True)]
    assert total == 6.0
    assert os.path.getsize(tmp_path / "counter_archive.db") == _INITIAL_MMAP_SIZE
