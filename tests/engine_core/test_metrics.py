from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, Histogram

from engine_core.metrics import TIME_BUCKETS, observe_all


def samples(histogram: Histogram) -> dict[str, float]:
    return {f"{s.name}{sorted(s.labels.items())}": s.value for metric in histogram.collect() for s in metric.samples}


@pytest.mark.parametrize(
    "amounts",
    [[], [0.0], [0.001, 0.001, 0.0011], [0.0004, 0.003, 0.07, 0.07, 2.5, 61.0, 1e9], [0.01] * 40],
)
def test_observing_a_batch_of_values_counts_them_as_observing_each(amounts: list[float]) -> None:
    """Bucket edges included (a value equal to an upper bound is in that bucket), +Inf and the sum."""
    one_by_one = Histogram("one", "", ["engine"], buckets=TIME_BUCKETS, registry=CollectorRegistry())
    together = Histogram("one", "", ["engine"], buckets=TIME_BUCKETS, registry=CollectorRegistry())
    child = one_by_one.labels("0")
    for amount in amounts:
        child.observe(amount)
    observe_all(together.labels("0"), amounts)
    assert samples(together) == pytest.approx(samples(one_by_one))
