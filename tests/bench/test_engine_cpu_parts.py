"""bench.answers_cpu and bench.engine_step_cpu, briefly: each runs and reports a positive CPU time per answer and per
request for every part it measures."""

from __future__ import annotations

import json
import subprocess
import sys

from bench.answers_cpu import Pair
from bench.harness.models import model_folder


def test_a_steps_answers_cross_the_wire_and_are_cut_back_into_rows() -> None:
    pair = Pair()
    try:
        engine, api_server = pair.round(per_step=8, steps=4)
    finally:
        pair.close()
    assert engine > 0 and api_server > 0


def test_the_engine_step_bench_times_every_part_on_the_simulated_gpu() -> None:
    model_folder("simgpu")  # built here, not inside the timed run
    done = subprocess.run(
        [sys.executable, "-m", "bench.engine_step_cpu", "--per-step", "8", "--steps", "3", "--rounds", "1",
         "--overhead", "1"],
        check=True, capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    row = json.loads(done.stdout.splitlines()[-1])
    assert row["overhead"] == 1.0
    assert set(row["us_per_request"]) == {"admit", "add", "next_batch", "run_batch", "encode"}
    assert all(us > 0 for us in row["us_per_request"].values())
