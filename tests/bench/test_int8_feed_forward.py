"""bench.int8_feed_forward, briefly: both int8 models are measured for accuracy on both text sets and timed at each
size, and the ratio follows from the times."""

from __future__ import annotations

import json
import os
import subprocess
import sys


def test_the_feed_forward_bench_measures_both_int8_models() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "bench.int8_feed_forward", "--threads", "1", "--rounds", "1", "--sentences", "8",
         "--sizes", "4"],
        check=True, capture_output=True, text=True, timeout=240, env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )  # fmt: skip
    rows = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    accuracy = {(row["texts"], row["model"]): row["cos_min"] for row in rows if "cos_min" in row}
    assert set(accuracy) == {(t, m) for t in ("corpus", "probe set") for m in ("before", "shipped")}
    assert all(0.99 < cosine < 1.0 for cosine in accuracy.values())  # int8 both, and close to float32
    (speed,) = [row for row in rows if "inputs" in row]
    assert speed["inputs"] == 4 and speed["threads"] == 1
    lowest = speed["ms_lowest"]
    assert lowest["before"] > 0 and lowest["shipped"] > 0
    assert speed["shipped_over_before"] == round(lowest["shipped"] / lowest["before"], 3)
