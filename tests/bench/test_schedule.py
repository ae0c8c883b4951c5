from __future__ import annotations

import itertools
import statistics

import pytest

from bench.harness.schedule import poisson_arrivals


def test_same_seed_same_schedule_other_seed_other_schedule() -> None:
    assert poisson_arrivals(100, 5, seed=1) == poisson_arrivals(100, 5, seed=1)
    assert poisson_arrivals(100, 5, seed=1) != poisson_arrivals(100, 5, seed=2)


def test_arrivals_are_increasing_and_inside_the_duration() -> None:
    arrivals = poisson_arrivals(50, 10, seed=0)
    assert all(a < b for a, b in itertools.pairwise(arrivals))
    assert arrivals[0] > 0 and arrivals[-1] < 10


def test_rate_and_exponential_gaps_match_a_poisson_process() -> None:
    arrivals = poisson_arrivals(200, 50, seed=3)
    # 10,000 expected; a Poisson count's standard deviation is 100.
    assert abs(len(arrivals) - 10_000) < 400
    gaps = [b - a for a, b in itertools.pairwise(arrivals)]
    # Exponential gaps: the standard deviation equals the mean (1/rate).
    assert statistics.mean(gaps) == pytest.approx(1 / 200, rel=0.05)
    assert statistics.stdev(gaps) == pytest.approx(1 / 200, rel=0.05)


def test_limit_caps_the_count_and_rate_must_be_positive() -> None:
    assert len(poisson_arrivals(1000, 10, seed=0, limit=25)) == 25
    with pytest.raises(ValueError, match="rate"):
        poisson_arrivals(0, 10, seed=0)
