"""A first start under --runtime auto: how soon the server answers, and what one client sees while the ONNX graph is
exported behind torch (engine_core/later_graph.py).

    python -m bench.first_start [--seconds 60] [--out FILE]

Starts the bundled model (`--dtype float32`, so that the graph is chosen whatever the CPU) with an empty
--onnx-cache-dir, so the engine serves through torch while a process of its own exports the graph; one client in a
closed loop (one sentence a request, httpx) from the moment it is ready. Then a second start on the cache the first
one filled, under the same client for up to 20 s, for the engine's resident memory against the first's. Printed:
seconds to ready, how long the export took (from the engine's log), latency per window (p50, p99, max), and both
engines' resident memory.
docs/benchmarks.md holds the figures and the command.
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

from bench.harness.server_process import PoolserveProcess

TOOK_OVER = re.compile(r"ONNX graph of \w+ exported, optimised and packed in ([\d.]+) s")
WINDOWS = ((0, 10), (10, 20), (20, 40), (40, 60), (60, 120), (120, 600))


def resident_mb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) // 1024
    return 0


def start(cache: Path, seconds: float) -> dict[str, object]:
    with PoolserveProcess("--dtype", "float32", "--onnx-cache-dir", str(cache)) as server:
        server.wait_ready()
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
            "graph_serving": "--runtime auto (ONNX Runtime for every pass): BertModel from" in log,
            "engine_rss_mb": resident_mb(engine),
            "windows": windows,
        }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as cache_dir:
        first = start(Path(cache_dir), args.seconds)
        print(f"first start: ready after {first['ready_after_s']} s; graph exported in {first['export_s']} s; "
              f"engine {first['engine_rss_mb']} MB")  # fmt: skip
        for window in first["windows"]:  # type: ignore[attr-defined]
            print(f"  {window['from_s']}-{window['to_s']} s: {window['requests']} requests, p50 {window['p50_ms']} "
                  f"ms, p99 {window['p99_ms']} ms, max {window['max_ms']} ms")  # fmt: skip
        cached = start(Path(cache_dir), min(args.seconds, 20))
        print(f"cached start: ready after {cached['ready_after_s']} s; engine {cached['engine_rss_mb']} MB")
    if args.out:
        args.out.write_text(json.dumps({"first": first, "cached": cached}, indent=2) + "\n")


if __name__ == "__main__":
    main()
