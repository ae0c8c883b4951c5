"""Summaries of measured latencies and counts: nearest-rank percentiles, rates, shares."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence

PERCENTILES = (50, 90, 99)


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile of already sorted values: the smallest value that at least q% of
    the values do not exceed. Unlike interpolation, it is always a latency that was measured."""
    if not sorted_values:
        return math.nan
    if not 0 < q <= 100:
        raise ValueError(f"percentile {q} is outside (0, 100]")
    rank = math.ceil(q / 100 * len(sorted_values))
    return sorted_values[max(rank, 1) - 1]


def summarize_latencies(seconds: Iterable[float]) -> dict[str, float]:
    """p50/p90/p99/max/mean in milliseconds (NaN when nothing was measured)."""
    values = sorted(seconds)
    summary = {f"p{q}": percentile(values, q) * 1000 for q in PERCENTILES}
    summary["max"] = values[-1] * 1000 if values else math.nan
    summary["mean"] = sum(values) / len(values) * 1000 if values else math.nan
    summary["count"] = len(values)
    return summary


def shares(counts: Mapping[str, int]) -> dict[str, float]:
    """Each key's fraction of the total, keys sorted (API-server indexes as strings)."""
    total = sum(counts.values())
    return {key: (counts[key] / total if total else 0.0) for key in sorted(counts, key=sort_key)}


def sort_key(key: str) -> tuple[int, int | str]:
    return (0, int(key)) if key.isdigit() else (1, key)


def rate(count: float, seconds: float) -> float:
    return count / seconds if seconds > 0 else 0.0


def count_by(values: Iterable[str]) -> dict[str, int]:
    counted = Counter(values)
    return {key: counted[key] for key in sorted(counted, key=sort_key)}
