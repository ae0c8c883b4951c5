"""bench.app_cpu, briefly: the API server's app answers its one-sentence request and its CPU per request comes out,
with every part in it and with the parts `--without` takes out (the bench exits if an answer is not a 200)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest


@pytest.mark.parametrize("without", ["", "metrics,tokenizer,vectors"])
def test_the_app_cpu_bench_answers_and_reports_each_round(without: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "bench.app_cpu", "--requests", "50", "--rounds", "2", "--without", without],
        check=True, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    figures = json.loads(done.stdout.splitlines()[-1])
    assert figures["without"] == [part for part in without.split(",") if part]
    assert len(figures["us_per_request"]) == 2 and figures["min_us_per_request"] > 0


def test_the_app_cpu_bench_refuses_a_part_it_does_not_know() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "bench.app_cpu", "--requests", "5", "--rounds", "1", "--without", "engine"],
        check=False, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 2 and "--without takes metrics, tokenizer, vectors, not engine" in done.stderr
