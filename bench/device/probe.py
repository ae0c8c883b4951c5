"""Where a served request's time goes on the GPU: one server, one load, then its /metrics.

    python3 bench/device/probe.py API_SERVERS CLIENTS WORKLOAD   # there, after run.sh's setup

Starts `launch --device cuda --api-server-count API_SERVERS`, runs bench.loadgen for 8 s, and
prints the loadgen's summary and the engine's histograms (batch sizes, queue wait, step time)."""

from __future__ import annotations

import json
import subprocess
import sys

import httpx

from bench.harness.server_process import PoolserveProcess

servers, clients, workload = sys.argv[1], sys.argv[2], sys.argv[3]
launched = PoolserveProcess("--device", "cuda", "--api-server-count", servers)
try:
    launched.wait_ready(120)
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench.loadgen",
            "--url",
            launched.url,
            "--workload",
            workload,
            "--concurrency",
            clients,
            "--duration",
            "8",
            "--warmup",
            "2",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    result = json.loads(done.stdout)
    print(json.dumps({k: result[k] for k in result if k in ("requests_per_s", "items_per_s", "latency_ms")}))
    metrics = httpx.get(f"{launched.url}/metrics", timeout=30).text
    for line in metrics.splitlines():
        if line.startswith("poolserve_") and ("_sum" in line or "_count" in line or "_total" in line):
            print(line)
finally:
    launched.stop()
