"""CPU time per request of every poolserve process, beside the floor of a bare Python frontend, in one run.

    python -m bench.request_cpu --model simgpu --clients 256 --seconds 10
    python -m bench.request_cpu --model bundled --clients 32 --workloads short

For each workload (short: one sentence; batch16: 16 sentences; rerank8: a query and 8 documents) it drives
`launch` with bench.loadgen in a closed loop and reads each process's CPU time from /proc over the measured
window: the supervisor, each API server, the engine. Divided by the requests answered in that window, that is
the CPU each process spends per request. The same load against bench.bare_app (uvicorn, msgspec, the same
tokenizer, a canned reply) gives the floor a Python frontend cannot go below; the API server's figure over it
is its own overhead. Also printed: the engine's mean batch (inputs a forward pass, from /metrics), and its CPU per
request by thread (`engine_threads_us_per_request`: `main` runs the steps; the other Python threads are `python`,
`python-2`, ... in the order they started, the I/O thread that receives and admits requests the busiest of them;
`ZMQbg/IO/0` is ZeroMQ's own).
`--generator wrk_load` drives the load from Debian's `wrk` (bench/wrk_load.py) instead of bench.loadgen, whose
own ~150 µs a request competes with the servers on a 2-core host.

`--model simgpu` (bench/harness/models.py, bench/harness/simulated_gpu.py) runs the real engine over a model whose pass
sleeps what the H100 run measured and computes next to nothing, with GPU batch caps: the engine's own CPU at a fast
accelerator's pace. docs/benchmarks.md, "CPU per request", holds the figures.
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

from bench.cpu_use import cpu_seconds, thread_cpu
from bench.harness.models import model_folder
from bench.harness.server_process import REPO, PoolserveProcess, ServerProcess, cmdline, process_tree, role_of

BARE_READY = re.compile(r"bare app listening on http://(?P<host>[^:]+):(?P<port>\d+)")
WORKLOADS = ("short", "batch16", "rerank8")
# A simulated GPU is batched as a GPU is (engine_core/loader.py's CUDA defaults). Its host work (one gather,
# the pooling) runs on one torch thread, as a GPU engine's host side does: on two threads of a busy 2-core host
# the OpenMP workers waited for each other's time slices, and that wait was most of the engine's CPU (780 against
# 136 µs a sentence, docs/benchmarks.md), a cost no GPU engine has.
GPU_CAPS = ["--max-batch-size", "256", "--max-batch-tokens", "32768", "--torch-threads", "1"]


def process_cpu(root: int) -> dict[str, float]:
    """CPU seconds of each process under `root`, named by role (API servers numbered in pid order)."""
    named: dict[str, float] = {}
    servers = 0
    for pid in process_tree(root):
        role = role_of(cmdline(pid))
        if role == "other" and pid == root:
            role = "bare"
        if role == "apiserver":
            role, servers = f"api-{servers}", servers + 1
        named[role] = named.get(role, 0.0) + cpu_seconds(pid)
    return named


def batch_inputs(url: str) -> tuple[float, float]:
    """The engine's poolserve_batch_inputs histogram: (sum, count) of inputs over forward passes."""
    text = urllib.request.urlopen(f"{url}/metrics", timeout=10).read().decode()
    total = count = 0.0
    for line in text.splitlines():
        if line.startswith("poolserve_batch_inputs_sum"):
            total += float(line.split()[-1])
        elif line.startswith("poolserve_batch_inputs_count"):
            count += float(line.split()[-1])
    return total, count


def measure(
    url: str, root: int, workload: str, *, clients: int, seconds: float, warmup: float, generator: str
) -> dict[str, Any]:
    argv = [sys.executable, "-m", f"bench.{generator}", "--url", url, "--workload", workload, "--concurrency",
            str(clients), "--duration", str(seconds), "--warmup", str(warmup)]  # fmt: skip
    if generator == "loadgen":
        argv += ["--prober-interval", "0"]
    loadgen = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
    time.sleep(warmup + 0.5)  # loadgen's own start-up (~0.5 s) and warm-up
    engine = engine_pid(root)
    threads_before = thread_cpu(engine) if engine else {}
    before, started = process_cpu(root), time.monotonic()
    batches_before = batch_inputs(url) if root_is_poolserve(root) else (0.0, 0.0)
    time.sleep(seconds - 1.0)
    after, window = process_cpu(root), time.monotonic() - started
    threads_after = thread_cpu(engine) if engine else {}
    batches_after = batch_inputs(url) if root_is_poolserve(root) else (0.0, 0.0)
    out, _ = loadgen.communicate(timeout=seconds + 120)
    result = json.loads(out.splitlines()[-1])
    requests = result["requests_per_s"] * window
    passes = batches_after[1] - batches_before[1]
    return {
        "workload": workload,
        "clients": clients,
        "requests_per_s": round(result["requests_per_s"], 1),
        "p99_ms": round(result["latency_ms"]["p99"], 1),
        "errors": result["errors"],
        "cpu_us_per_request": {
            role: round((after[role] - before.get(role, 0.0)) / requests * 1e6, 1) for role in after if requests
        },
        # The engine's threads apart (the module's docstring says which is which).
        "engine_threads_us_per_request": {
            name: round((threads_after[name] - threads_before.get(name, 0.0)) / requests * 1e6, 1)
            for name in threads_after
            if requests
        },
        "mean_batch_inputs": round((batches_after[0] - batches_before[0]) / passes, 1) if passes else None,
        "generator_cores": round(result["generator"]["cpu_share"], 3),
    }


def engine_pid(root: int) -> int | None:
    """The (first) engine process under `root`, if any."""
    return next((pid for pid in process_tree(root) if role_of(cmdline(pid)) == "engine"), None)


def root_is_poolserve(root: int) -> bool:
    return role_of(cmdline(root)) == "supervisor"


def start_bare() -> tuple[ServerProcess, str]:
    server = ServerProcess("bare", [sys.executable, "-m", "bench.bare_app", "--port", "0"])
    match = server.wait_for_line(BARE_READY, 60)
    return server, f"http://{match['host']}:{match['port']}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="simgpu", help="a bench.harness.models kind (simgpu, bundled, ...)")
    parser.add_argument("--workloads", default=",".join(WORKLOADS))
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--warmup", type=float, default=2.0)
    parser.add_argument("--api-servers", type=int, default=1)
    parser.add_argument("--no-bare", action="store_true", help="skip the bare frontend's floor")
    parser.add_argument(
        "--generator",
        choices=["loadgen", "wrk_load"],
        default="loadgen",
        help="the load: bench.loadgen (Python, ~150 µs a request of its own) or bench.wrk_load (Debian's wrk)",
    )
    parser.add_argument(
        "--server-flags", default="", help="more `launch` flags, as one string ('--otlp-endpoint http://...')"
    )
    parser.add_argument(
        "--cwd", type=Path, default=REPO, help="the checkout whose server runs (a `git worktree` of an earlier commit)"
    )
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    workloads = args.workloads.split(",")
    flags = ["--api-server-count", str(args.api_servers), "--dtype", "float32", *shlex.split(args.server_flags)]
    if args.model != "bundled":
        flags = ["--model", str(model_folder(args.model)), *flags]
    if args.model == "simgpu":
        flags += ["--trust-remote-code", *GPU_CAPS]
    rows: list[dict[str, Any]] = []

    def measure_all(url: str, pid: int, target: str) -> None:
        for workload in workloads:
            figures = measure(
                url,
                pid,
                workload,
                clients=args.clients,
                seconds=args.seconds,
                warmup=args.warmup,
                generator=args.generator,
            )
            row = {"target": target, **figures}
            print(json.dumps(row), flush=True)
            rows.append(row)

    server = PoolserveProcess(*flags, cwd=args.cwd)
    try:
        server.wait_ready(300)
        measure_all(server.url, server.pid, f"poolserve {args.model}")
    finally:
        server.stop()
    if not args.no_bare:
        bare, url = start_bare()
        try:
            measure_all(url, bare.pid, "bare app")
        finally:
            bare.stop()
    if args.out:
        args.out.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
