"""One scrape of a server's /metrics, as sample -> value (the bench's figures and the tests' checks)."""

from __future__ import annotations

import httpx
from prometheus_client.parser import text_string_to_metric_families

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(url: str) -> Samples:
    """One scrape of /metrics on a new connection (so any API server may answer), as sample -> value."""
    with httpx.Client(base_url=url, timeout=10) as client:
        response = client.get("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(response.text)
        for sample in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float:
    """The samples `name` with these labels, summed over the labels not given (a server of several models has a
    series per `model`); 0 when the scrape has none."""
    wanted = labels.items()
    return sum(count for (sample, tags), count in samples.items() if sample == name and wanted <= dict(tags).items())


def total(samples: Samples, name: str) -> float:
    """A sample summed over its labels (engines, modalities)."""
    return sum(value for (sample, _), value in samples.items() if sample == name)
