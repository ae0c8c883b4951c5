"""bench.int8_without_vnni, briefly: in its own process held to AVX2, the int8 products saturate, 8-bit weights are
refused, the 7-bit int8 model is measured for accuracy and timed against float32."""

from __future__ import annotations

import json
import os
import subprocess
import sys


def test_the_without_vnni_bench_measures_int8_held_to_avx2() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "bench.int8_without_vnni", "--threads", "1", "--rounds", "1", "--sentences", "8",
         "--sizes", "4"],
        check=True, capture_output=True, text=True, timeout=240, env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )  # fmt: skip
    rows = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    (held,) = [row for row in rows if "int8_products_saturate" in row]
    assert held == {"int8_products_saturate": True, "ONEDNN_MAX_CPU_ISA": "AVX2", "ATEN_CPU_CAPABILITY": "avx2"}
    (eight_bit,) = [row["int8_with_8_bit_weights"] for row in rows if "int8_with_8_bit_weights" in row]
    assert eight_bit.startswith("--dtype int8 is refused for this model"), eight_bit
    accuracy = {row["texts"]: row["cos_min"] for row in rows if "cos_min" in row}
    assert set(accuracy) == {"corpus", "probe set"}
    assert all(0.99 < cosine < 1.0 for cosine in accuracy.values())  # int8 indeed, and close to float32
    (speed,) = [row for row in rows if "inputs" in row]
    assert speed["inputs"] == 4 and speed["threads"] == 1
    lowest = speed["ms_lowest"]
    assert lowest["float32"] > 0 and lowest["int8"] > 0
    assert speed["int8_over_float32"] == round(lowest["int8"] / lowest["float32"], 3)
