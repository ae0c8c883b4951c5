from __future__ import annotations

import math

import pytest

from bench.harness.stats import count_by, percentile, rate, shares, summarize_latencies


def test_percentile_is_nearest_rank_so_it_is_always_a_measured_value() -> None:
    values = [float(v) for v in range(1, 101)]
    assert percentile(values, 50) == 50.0
    assert percentile(values, 99) == 99.0
    assert percentile(values, 100) == 100.0
    assert percentile([1.0, 2.0, 3.0], 50) == 2.0
    assert percentile([7.0], 99) == 7.0


def test_percentile_of_nothing_is_nan_and_bad_q_is_refused() -> None:
    assert math.isnan(percentile([], 50))
    with pytest.raises(ValueError, match="outside"):
        percentile([1.0], 0)


def test_summary_is_in_milliseconds() -> None:
    summary = summarize_latencies([0.003, 0.001, 0.002, 0.010])
    assert summary["p50"] == pytest.approx(2.0)
    assert summary["p99"] == pytest.approx(10.0)
    assert summary["max"] == pytest.approx(10.0)
    assert summary["mean"] == pytest.approx(4.0)
    assert summary["count"] == 4


def test_empty_summary_has_nans_and_zero_count() -> None:
    summary = summarize_latencies([])
    assert math.isnan(summary["p50"]) and math.isnan(summary["max"]) and summary["count"] == 0


def test_shares_sort_server_indexes_numerically() -> None:
    assert list(shares({"10": 1, "2": 1, "0": 2})) == ["0", "2", "10"]
    assert shares({"0": 3, "1": 1}) == {"0": 0.75, "1": 0.25}
    assert shares({}) == {}


def test_rate_and_count_by() -> None:
    assert rate(10, 2.0) == 5.0
    assert rate(10, 0.0) == 0.0
    assert count_by(["200", "503", "200", "ConnectionResetError"]) == {"200": 2, "503": 1, "ConnectionResetError": 1}
