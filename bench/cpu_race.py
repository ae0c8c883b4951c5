"""The CPU race against ONNX Runtime (issue 33): poolserve's default, `--dtype float32` (with the default `--runtime
auto`, hybrid for the bundled model where float32 is served; with `--runtime torch`: "poolserve float32 torch"; with
`--runtime onnxruntime`: "poolserve float32 onnx"; with `--runtime hybrid`: "poolserve float32 hybrid") and `--dtype
int8` (also "poolserve int8 torch" and "poolserve int8 hybrid") beside Infinity's ONNX Runtime engine in fp32 and
int8, every target under the same closed-loop loads, in one run.

    make bench-onnx-peer
    python -m bench.cpu_race [--points 1:a,32:a,8:b] [--seconds 10] [--passes 2] [--targets ...]
        [--warmup 2] [--poolserve-flags "--torch-threads 1"] [--interleave] [--generator wrk_load] [--out FILE]

A point is `clients:workload` (bench/harness/workloads.py: (a) one sentence a request, (b) 16). Each pass starts each
target once and runs every point on it; the second pass runs the targets in the opposite order, so neither side
always goes first on this shared host. With `--interleave` every target is started at once and kept up, and each
point is measured on every target in turn (the order flipping each pass), so that the runs a ratio compares are
seconds apart rather than minutes: on this shared host a target's own figure drifted 15-30 % between passes, more
than the targets differ by. Each target's CPU at idle (the others idle too) is read over 5 s first and reported
(`idle_cores`): it is what the idle targets take from the one measured. `--generator wrk_load` drives the load with
Debian's wrk (bench.wrk_load) instead of bench.loadgen, whose Python costs ~150 µs a request beside the servers. Per
run: requests/s, p50 and p99, and the cores the target's whole process tree used over the measured window (CPU
seconds from /proc over wall seconds). Each target's vectors are checked against sentence-transformers' float32 ones
first (cos min over 64 corpus sentences). At the end, per point and pass: the issue's ratios (throughput, and p99 the
other way up), each computed within one pass.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench import onnx_peer
from bench.cpu_use import cpu_seconds
from bench.harness.corpus import make_sentences
from bench.harness.models import bundled_model_folder
from bench.harness.server_process import PoolserveProcess, ServerProcess, process_tree

SERVED_NAME = "sentence-transformers/all-MiniLM-L6-v2"


@dataclass(frozen=True)
class Target:
    name: str
    path: str  # where its embeddings route is
    start: Callable[[], ServerProcess]


def poolserve(*flags: str, extra: tuple[str, ...] = ()) -> Callable[[], ServerProcess]:
    def start() -> ServerProcess:
        return PoolserveProcess("--api-server-count", "2", *flags, *extra).wait_ready(300)

    return start


def infinity(folders: dict[str, Path], variant: str) -> Callable[[], ServerProcess]:
    return lambda: onnx_peer.start(folders[variant], SERVED_NAME)


def tree_cpu(root: int) -> float:
    return sum(cpu_seconds(pid) for pid in process_tree(root))


def measure(
    server: ServerProcess,
    path: str,
    clients: int,
    workload: str,
    seconds: float,
    *,
    warmup: float = 2.0,
    generator: str = "loadgen",
) -> dict[str, Any]:
    """One closed-loop run of `generator` (bench.loadgen, or bench.wrk_load: Debian's wrk) after `warmup` seconds of
    the same load; the target's CPU is read over (about) its measured window."""
    argv = [sys.executable, "-m", f"bench.{generator}", "--url", server.url, "--workload", workload, "--path", path,
            "--model-name", SERVED_NAME, "--concurrency", str(clients), "--duration", str(seconds),
            "--warmup", str(warmup)]  # fmt: skip
    if generator == "loadgen":
        argv += ["--prober-interval", "0"]
    load = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
    time.sleep(warmup + 0.5)  # the generator's start-up and warm-up
    before, started = tree_cpu(server.pid), time.monotonic()
    time.sleep(max(seconds - 1.0, 0.5))
    cores = (tree_cpu(server.pid) - before) / (time.monotonic() - started)
    out, _ = load.communicate(timeout=seconds + 120)
    result = json.loads(out.splitlines()[-1])
    return {
        "clients": clients,
        "workload": workload,
        "requests_per_s": round(result["requests_per_s"], 1),
        "p50_ms": round(result["latency_ms"]["p50"], 1),
        "p99_ms": round(result["latency_ms"]["p99"], 1),
        "cores": round(cores, 2),
        "errors": sum(result["errors"].values()),
    }


def idle_cores(servers: dict[str, ServerProcess], seconds: float = 5.0) -> dict[str, float]:
    """Each server's process tree's cores over `seconds` with no load on any."""
    before = {name: tree_cpu(server.pid) for name, server in servers.items()}
    started = time.monotonic()
    time.sleep(seconds)
    elapsed = time.monotonic() - started
    return {name: round((tree_cpu(server.pid) - before[name]) / elapsed, 3) for name, server in servers.items()}


# The ratios: (numerator, denominator).
RATIOS = {
    "float32 / onnx fp32": ("poolserve float32", "infinity onnx fp32"),
    "default / onnx int8": ("poolserve default", "infinity onnx int8"),
    "default / onnx fp32": ("poolserve default", "infinity onnx fp32"),
    "int8 / onnx int8": ("poolserve int8", "infinity onnx int8"),
    "float32 onnxruntime / onnx fp32": ("poolserve float32 onnx", "infinity onnx fp32"),
    "float32 onnxruntime / float32": ("poolserve float32 onnx", "poolserve float32"),
    "float32 hybrid / onnx fp32": ("poolserve float32 hybrid", "infinity onnx fp32"),
    "int8 hybrid / onnx int8": ("poolserve int8 hybrid", "infinity onnx int8"),
    "float32 torch / onnx fp32": ("poolserve float32 torch", "infinity onnx fp32"),
    "int8 torch / onnx int8": ("poolserve int8 torch", "infinity onnx int8"),
}


def ratios(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each ratio at each point within one pass: throughput, and p99 (numerator's over denominator's)."""
    rows = []
    by_key = {(r["pass"], r["target"], r["clients"], r["workload"]): r for r in runs}
    for (pass_, target, clients, workload), run in by_key.items():
        for label, (top, bottom) in RATIOS.items():
            other = by_key.get((pass_, bottom, clients, workload))
            if target != top or other is None or not other["requests_per_s"]:
                continue
            rows.append({
                "pass": pass_, "ratio": label, "point": f"{clients}:{workload}",
                "throughput": round(run["requests_per_s"] / other["requests_per_s"], 2),
                "p99": round(run["p99_ms"] / max(other["p99_ms"], 1e-9), 2),
            })  # fmt: skip
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--points", default="1:a,32:a,8:b", help="clients:workload, comma-separated")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--passes", type=int, default=2)
    parser.add_argument("--warmup", type=float, default=2.0, help="seconds of each point's load before it is measured")
    parser.add_argument(
        "--targets",
        default="poolserve default,poolserve float32,poolserve int8,infinity onnx fp32,infinity onnx int8",
        help="comma-separated; the peer's need `make bench-onnx-peer`",
    )
    parser.add_argument(
        "--poolserve-flags", default="", help='more flags for every poolserve target, e.g. "--torch-threads 1"'
    )
    parser.add_argument(
        "--interleave", action="store_true", help="every target up at once, each point measured on each in turn"
    )
    parser.add_argument(
        "--generator",
        choices=("loadgen", "wrk_load"),
        default="loadgen",
        help="the load: bench.loadgen (Python, ~150 µs a request of its own) or bench.wrk_load (Debian's wrk)",
    )
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    extra = tuple(args.poolserve_flags.split())
    points = [(int(c), w) for c, w in (p.split(":") for p in args.points.split(","))]
    wanted = args.targets.split(",")
    targets = {
        "poolserve default": Target("poolserve default", "/v1/embeddings", poolserve(extra=extra)),
        "poolserve float32": Target(
            "poolserve float32", "/v1/embeddings", poolserve("--dtype", "float32", extra=extra)
        ),
        "poolserve int8": Target("poolserve int8", "/v1/embeddings", poolserve("--dtype", "int8", extra=extra)),
        "poolserve float32 torch": Target(
            "poolserve float32 torch",
            "/v1/embeddings",
            poolserve("--dtype", "float32", "--runtime", "torch", extra=extra),
        ),
        "poolserve int8 torch": Target(
            "poolserve int8 torch", "/v1/embeddings", poolserve("--dtype", "int8", "--runtime", "torch", extra=extra)
        ),
        "poolserve float32 onnx": Target(
            "poolserve float32 onnx",
            "/v1/embeddings",
            poolserve("--dtype", "float32", "--runtime", "onnxruntime", extra=extra),
        ),
        "poolserve float32 hybrid": Target(
            "poolserve float32 hybrid",
            "/v1/embeddings",
            poolserve("--dtype", "float32", "--runtime", "hybrid", extra=extra),
        ),
        "poolserve int8 hybrid": Target(
            "poolserve int8 hybrid", "/v1/embeddings", poolserve("--dtype", "int8", "--runtime", "hybrid", extra=extra)
        ),
    }
    if any(name.startswith("infinity") for name in wanted):
        if reason := onnx_peer.missing():
            raise SystemExit(reason)
        folders = onnx_peer.prepare(bundled_model_folder())
        targets["infinity onnx fp32"] = Target("infinity onnx fp32", "/embeddings", infinity(folders, "fp32"))
        targets["infinity onnx int8"] = Target("infinity onnx int8", "/embeddings", infinity(folders, "int8"))
    order = [targets[name] for name in wanted]
    texts = make_sentences(64, 0)
    reference = onnx_peer.reference_vectors(bundled_model_folder(), texts)
    runs: list[dict[str, Any]] = []
    parity: dict[str, float] = {}
    extras: dict[str, Any] = {}

    def check(target: Target, server: ServerProcess) -> None:
        if target.name not in parity:
            served = onnx_peer.vectors(server.url, target.path, SERVED_NAME, texts)
            parity[target.name] = round(onnx_peer.cosine_min(served, reference), 5)

    def run(pass_: int, target: Target, server: ServerProcess, clients: int, workload: str) -> None:
        measured = measure(
            server, target.path, clients, workload, args.seconds, warmup=args.warmup, generator=args.generator
        )
        row = {"pass": pass_, "target": target.name, **measured}
        print(json.dumps(row), flush=True)
        runs.append(row)

    if args.interleave:
        servers: dict[str, ServerProcess] = {}
        try:
            for target in order:
                servers[target.name] = target.start()
                check(target, servers[target.name])
            extras["idle_cores"] = idle_cores(servers)
            print(json.dumps(extras), flush=True)
            for pass_ in range(args.passes):
                for clients, workload in points:
                    for target in order if pass_ % 2 == 0 else order[::-1]:
                        run(pass_, target, servers[target.name], clients, workload)
        finally:
            for server in servers.values():
                server.stop()
    else:
        for pass_ in range(args.passes):
            for target in order if pass_ % 2 == 0 else order[::-1]:
                server = target.start()
                try:
                    check(target, server)
                    for clients, workload in points:
                        run(pass_, target, server, clients, workload)
                finally:
                    server.stop()
    summary = {"cos_min": parity, **extras, "ratios": ratios(runs)}
    print(json.dumps(summary, indent=1))
    if args.out:
        args.out.write_text(json.dumps({"command": sys.argv, "runs": runs, **summary}, indent=1) + "\n")


if __name__ == "__main__":
    main()
