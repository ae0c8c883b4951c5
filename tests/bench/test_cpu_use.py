"""bench.cpu_use, briefly: a server's CPU by role, idle (no load) and under one client."""

from __future__ import annotations

import json
import os
import subprocess
import sys


def test_cpu_use_reads_each_role_idle_and_under_load() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "bench.cpu_use", "--clients", "0,1", "--seconds", "1.5", "--warmup", "0.5"],
        check=True, capture_output=True, text=True, timeout=300, env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )  # fmt: skip
    idle, loaded = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert idle["clients"] == 0 and idle["requests_per_s"] == 0.0
    assert {"engine", "apiserver"} <= set(idle["cores"]), idle
    assert all(0.0 <= cores < 0.2 for cores in idle["cores"].values()), idle  # idle: next to nothing
    assert loaded["clients"] == 1 and loaded["requests_per_s"] > 0 and loaded["errors"] == {}
    assert loaded["cores"]["engine"] > idle["cores"]["engine"]
