"""bench.pass_contention, briefly: every way it serves the batches reports a positive rate, and the ratios follow from
the best rates."""

from __future__ import annotations

import json
import os
import subprocess
import sys


def test_the_contention_bench_serves_each_way_and_compares_them() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "bench.pass_contention", "--dtype", "float32", "--inputs", "2", "--passes", "2",
         "--rounds", "1", "--busy-ms", "0.5", "--period-ms", "2"],
        check=True, capture_output=True, text=True, timeout=240, env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )  # fmt: skip
    summary = json.loads(done.stdout.splitlines()[-1])
    best = summary["best_inputs_per_s"]
    assert set(best) == {"whole", "lanes", "whole+other", "lanes+other"}
    assert all(rate > 0 for rate in best.values())
    assert summary["competitor_cores"] == 0.25
    assert summary["lanes_over_whole"] == round(best["lanes"] / best["whole"], 2)
