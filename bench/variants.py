"""Server variants alternated under one load: what each does to throughput, tail and batching.

    python -m bench.variants --variant "" --variant "--token-packing off" [--clients 32] [--workload a]
        [--seconds 10] [--rounds 4] [--generator loadgen|wrk_load] [--out FILE]

A variant may start with `cwd=DIR`: its server runs the code of that checkout (a `git worktree` of an
earlier commit), so two commits are compared under one alternated load:
`--variant "cwd=/tmp/before" --variant ""`. It may also start with any number of `env=NAME=VALUE`: its server's
processes get those environment variables (`--variant "env=OMP_WAIT_POLICY=PASSIVE --dtype float32"`).

For each round, each variant in turn: a fresh server (2 API servers with a preprocessing thread
each, plus the variant's flags), bench.loadgen in a closed loop for `--seconds` after 2 s of warm-up,
then the engine's own histograms from /metrics: inputs and padded tokens per forward pass, the
pass's mean time and the mean queue wait, and the share of the CPU stolen by the hypervisor over
the run (this project's machine is shared: alternating is what makes variants comparable). Prints
one JSON line per run and each variant's means at the end; `--out` writes them all as JSON.
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import subprocess
import sys
from pathlib import Path

from bench.harness.scrape import scrape, total
from bench.harness.server_process import REPO, PoolserveProcess


def cpu_ticks() -> list[int]:
    with open("/proc/stat") as stat:
        return [int(field) for field in stat.readline().split()[1:]]


def split_variant(variant: str) -> tuple[Path, dict[str, str], list[str]]:
    """A variant's checkout (`cwd=DIR`, else this one), environment (`env=NAME=VALUE`, each) and launch flags."""
    flags = shlex.split(variant)
    cwd, env = REPO, {}
    while flags and flags[0].startswith(("cwd=", "env=")):
        word = flags.pop(0)
        if word.startswith("cwd="):
            cwd = Path(word.removeprefix("cwd="))
            continue
        name, equals, value = word.removeprefix("env=").partition("=")
        if not name or not equals:
            raise SystemExit(f"{word!r}: an environment variable is given as env=NAME=VALUE")
        env[name] = value
    return cwd, env, flags


def run(variant: str, clients: int, workload: str, seconds: float, generator: str = "loadgen") -> dict[str, object]:
    cwd, env, flags = split_variant(variant)
    server = PoolserveProcess("--api-server-count", "2", "--preprocess-workers", "1", *flags, env=env, cwd=cwd)
    try:
        server.wait_ready(120)
        before = cpu_ticks()
        done = subprocess.run(
            [sys.executable, "-m", f"bench.{generator}", "--url", server.url, "--workload", workload,
             "--concurrency", str(clients), "--duration", str(seconds), "--warmup", "2"],
            capture_output=True, text=True, check=True,
        )  # fmt: skip
        spent = [b - a for a, b in zip(before, cpu_ticks(), strict=True)]
        result = json.loads(done.stdout)
        samples = scrape(server.url)
    finally:
        server.stop()
    passes = max(total(samples, "poolserve_batch_inputs_count"), 1.0)
    waits = max(total(samples, "poolserve_queue_duration_seconds_count"), 1.0)
    latency = result["latency_ms"]
    return {
        "variant": variant,
        "requests_per_s": round(result["requests_per_s"], 1),
        "errors": sum(result["errors"].values()),
        "p50_ms": round(latency["p50"], 1),
        "p90_ms": round(latency["p90"], 1) if "p90" in latency else None,  # wrk_load reports p50 and p99
        "p99_ms": round(latency["p99"], 1),
        "inputs_per_pass": round(total(samples, "poolserve_batch_inputs_sum") / passes, 1),
        "padded_tokens_per_pass": round(total(samples, "poolserve_batch_tokens_sum") / passes),
        "ms_per_pass": round(1000 * total(samples, "poolserve_forward_duration_seconds_sum") / passes, 1),
        "queue_ms": round(1000 * total(samples, "poolserve_queue_duration_seconds_sum") / waits, 1),
        "steal": round(spent[7] / max(sum(spent), 1), 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variant", action="append", required=True, help="Server flags ('' for the defaults).")
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--workload", default="a")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument(
        "--generator",
        choices=["loadgen", "wrk_load"],
        default="loadgen",
        help="the load: bench.loadgen (Python, ~150 µs a request of its own) or bench.wrk_load (Debian's wrk)",
    )
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    runs = []
    for _ in range(args.rounds):
        for variant in args.variant:
            runs.append(run(variant, args.clients, args.workload, args.seconds, args.generator))
            print(json.dumps(runs[-1]), flush=True)
    means = {
        variant: {
            key: round(statistics.fmean(float(r[key]) for r in runs if r["variant"] == variant), 1)  # type: ignore[arg-type]
            for key in ("requests_per_s", "p50_ms", "p99_ms", "inputs_per_pass")
        }
        for variant in args.variant
    }
    print(json.dumps({"means": means}, indent=1))
    if args.out:
        args.out.write_text(json.dumps({"command": sys.argv, "runs": runs, "means": means}, indent=1) + "\n")


if __name__ == "__main__":
    main()
