"""bench.request_cpu, briefly: the simulated GPU model loads through the real loader as its own code, the engine
batches it, and every process's CPU per request comes out, beside the bare frontend's floor."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from bench.harness.models import model_folder


def test_the_cpu_per_request_bench_runs_on_the_simulated_gpu(tmp_path: Path) -> None:
    model_folder("simgpu")  # built here, not inside the timed run
    out = tmp_path / "cpu.json"
    subprocess.run(
        [sys.executable, "-m", "bench.request_cpu", "--model", "simgpu", "--workloads", "short", "--clients", "4",
         "--seconds", "2", "--warmup", "0.5", "--out", str(out)],
        check=True, capture_output=True, timeout=240,
    )  # fmt: skip
    poolserve, bare = json.loads(out.read_text())["rows"]
    assert poolserve["target"] == "poolserve simgpu" and bare["target"] == "bare app"
    for row in (poolserve, bare):
        assert row["errors"] == {} and row["requests_per_s"] > 0
    assert poolserve["cpu_us_per_request"]["engine"] > 0 and poolserve["cpu_us_per_request"]["api-0"] > 0
    assert poolserve["mean_batch_inputs"] >= 1
    threads = poolserve["engine_threads_us_per_request"]
    # /proc counts CPU in 10 ms ticks: over this brief window a single thread may read 0, the engine as a whole not.
    assert "main" in threads and any(name.startswith("ZMQbg/IO") for name in threads) and sum(threads.values()) > 0
    assert bare["engine_threads_us_per_request"] == {}
    assert bare["cpu_us_per_request"]["bare"] > 0
