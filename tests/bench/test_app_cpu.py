"""bench.app_cpu, briefly: the API server's app answers its one-sentence request and its CPU per request comes out."""

from __future__ import annotations

import json
import subprocess
import sys


def test_the_app_cpu_bench_answers_and_reports_each_round() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "bench.app_cpu", "--requests", "50", "--rounds", "2"],
        check=True, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    figures = json.loads(done.stdout.splitlines()[-1])
    assert len(figures["us_per_request"]) == 2 and figures["min_us_per_request"] > 0
