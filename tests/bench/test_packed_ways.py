"""bench.packed_ways, briefly: each way's comparison reports both ways' rates, their ratio and answers that agree; the
shapes report both timings and differences from the kernel within float32's rounding."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

ENV = {**os.environ, "HF_HUB_OFFLINE": "1"}


def bench(*argv: str) -> list[dict[str, object]]:
    done = subprocess.run(
        [sys.executable, "-m", "bench.packed_ways", *argv],
        check=True,
        capture_output=True,
        text=True,
        timeout=240,
        env=ENV,
    )
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]


@pytest.mark.parametrize(("way", "names"), [("join", ["apart", "joined"]), ("attention", ["kernel", "products"])])
def test_each_way_is_compared_with_the_way_before_it(way: str, names: list[str]) -> None:
    (line,) = bench("--way", way, "--dtype", "float32", "--inputs", "3", "--sentences", "3")
    rates = line["sentences_per_s"]
    assert isinstance(rates, dict) and list(rates) == names and all(rate > 0 for rate in rates.values())
    assert line["ratio"] == round(rates[names[1]] / rates[names[0]], 3)
    assert isinstance(line["min_cosine"], float) and line["min_cosine"] > 0.99999


def test_the_attention_call_alone_on_each_grid() -> None:
    lines = bench("--shapes", "--times", "1")
    assert [(line["inputs"], line["width"]) for line in lines][:2] == [(1, 16), (1, 48)]
    for line in lines:
        timings, differences = line["microseconds"], line["max_difference"]
        assert isinstance(timings, dict) and isinstance(differences, dict)
        assert all(value > 0 for value in timings.values())
        assert float(differences["products"]) < 1e-5
