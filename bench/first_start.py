"""A first start under --runtime auto: how soon the server answers, and what one client sees while the ONNX graph is
exported behind torch (engine_core/later_graph.py).

    python -m bench.first_start [--seconds 60] [--baseline CHECKOUT] [--out FILE]

Starts the bundled model (`--dtype float32`, so that the graph is chosen whatever the CPU) with an empty
--onnx-cache-dir, so the engine serves through torch while a process of its own exports the graph; one client in a
closed loop (one sentence a request, httpx) from the moment it is ready. Then a second start on the cache the first
one filled, under the same client for up to 20 s, for the engine's resident memory against the first's. Printed:
seconds to ready, how long the export took (from the engine's log), latency per window (p50, p99, max), and both
engines' resident memory. `--baseline`: another checkout's first start first (a `git worktree` of an earlier commit),
under the same load. docs/benchmarks.md holds the figures and the command.
"""

from __future__ import annotations

import argparse
import json
import re
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np

from bench.harness.server_process import REPO, PoolserveProcess, memory_mb

TOOK_OVER = re.compile(r"ONNX graph of \w+ exported, optimised and packed in ([\d.]+) s")
# the graph for every pass (a CPU without AVX-512), or hybrid's small passes (one with it)
GRAPH_SERVING = re.compile(r"--runtime auto \((ONNX Runtime for every pass|hybrid)\): BertModel from")
WINDOWS = ((0, 10), (10, 20), (20, 40), (40, 60), (60, 120), (120, 600))


def start(cache: Path, seconds: float, checkout: Path = REPO) -> dict[str, object]:
    with PoolserveProcess("--dtype", "float32", "--onnx-cache-dir", str(cache), cwd=checkout) as server:
        server.wait_ready(graph=False)  # the load starts the moment the server is ready
        started, latencies = time.monotonic(), []
        with httpx.Client(base_url=server.url, timeout=30) as client:
            while time.monotonic() - started < seconds:
                at, sent = time.monotonic() - started, time.perf_counter()
                response = client.post("/v1/embeddings", json={"input": "a sentence of a few words, as one client's"})
                response.raise_for_status()
                latencies.append((at, (time.perf_counter() - sent) * 1000))
        log = server.stderr()
        took = TOOK_OVER.search(log)
        (engine,) = server.child_pid("engine_core")
        windows = []
        for low, high in WINDOWS:
            inside = [ms for at, ms in latencies if low <= at < high]
            if inside:
                windows.append({"from_s": low, "to_s": high, "requests": len(inside),
                                "p50_ms": round(float(np.percentile(inside, 50)), 1),
                                "p99_ms": round(float(np.percentile(inside, 99)), 1),
                                "max_ms": round(max(inside), 1)})  # fmt: skip
        return {
            "ready_after_s": round(server.ready_after, 1),
            "export_s": float(took.group(1)) if took else None,
            "graph_serving": bool(GRAPH_SERVING.search(log)),
            "engine_rss_mb": round(memory_mb(engine).get("rss_mb", 0.0)),
            "windows": windows,
        }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--baseline", type=Path, help="a checkout (a git worktree) whose first start runs first")
    args = parser.parse_args()
    results: dict[str, object] = {}
    if args.baseline:
        with tempfile.TemporaryDirectory() as cache_dir:
            baseline = results["baseline"] = start(Path(cache_dir), args.seconds, args.baseline)
            report(f"baseline ({args.baseline})", baseline)
    with tempfile.TemporaryDirectory() as cache_dir:
        first = results["first"] = start(Path(cache_dir), args.seconds)
        report("first start", first)
        cached = results["cached"] = start(Path(cache_dir), min(args.seconds, 20))
        report("cached start", cached)
    if args.out:
        args.out.write_text(json.dumps(results, indent=2) + "\n")


def report(name: str, run: dict[str, object]) -> None:
    print(f"{name}: ready after {run['ready_after_s']} s; graph exported behind torch in {run['export_s']} s; "
          f"the graph serving at the end: {run['graph_serving']}; engine {run['engine_rss_mb']} MB")  # fmt: skip
    for window in run["windows"]:  # type: ignore[attr-defined]
        print(f"  {window['from_s']}-{window['to_s']} s: {window['requests']} requests, p50 {window['p50_ms']} ms, "
              f"p99 {window['p99_ms']} ms, max {window['max_ms']} ms")  # fmt: skip


if __name__ == "__main__":
    main()
