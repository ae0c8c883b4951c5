"""Served against the offline ceiling, at equal precision, in one run: issue 28's CPU target.

    python -m bench.served_share --rounds 2 --seconds 10 [--warmup 2] [--clients 32] [--api-servers 2]
        [--generator wrk_load] [--flags "--token-packing off"] [--out FILE]

The ceiling is what a user who skips serving gets: sentence-transformers' `encode` in float32 over the 2,048
sentences of workload (a) in batches of 32 (it sorts them by length itself), both cores to itself
(bench.st_offline). The served figure is poolserve `--dtype float32` under a closed loop of single-sentence
`/v1/embeddings` requests over the same sentences. Each round runs both, in turn, the order swapped every round
(this 2-core host is shared: a ratio means something within a round), and reports served sentences/s ÷ the
ceiling's, with the 1-minute load average at each start. `wrk` (a native generator, a few µs a request) is the
default where it is installed: bench.loadgen's own ~150 µs a request would compete with the server for the cores.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

from bench.harness.server_process import PoolserveProcess

CEILING_BATCH = 32


def load_average() -> float:
    return round(os.getloadavg()[0], 2)


def ceiling(seconds: float, sentences: int) -> dict[str, object]:
    """sentence-transformers' float32 sentences/s at batch 32 over the corpus (its first `sentences`; 0: all), in
    its own process."""
    done = subprocess.run(
        [sys.executable, "-m", "bench.st_offline", "--dtype", "float32", "--batch-sizes", str(CEILING_BATCH),
         "--seconds", str(seconds), "--sentences", str(sentences)],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    best = json.loads(done.stdout)["best"]
    return {"sentences_per_s": round(best["sentences_per_s"], 1)}


def served(
    seconds: float, clients: int, api_servers: int, generator: str, flags: list[str], *, warmup: float = 2.0
) -> dict[str, object]:
    """poolserve float32's single-sentence requests/s (one sentence each: sentences/s) and tail under a closed loop,
    after `warmup` seconds of it."""
    server = PoolserveProcess(
        "--api-server-count", str(api_servers), "--device", "cpu", "--dtype", "float32", *flags
    ).wait_ready(120)
    try:
        done = subprocess.run(
            [sys.executable, "-m", f"bench.{generator}", "--url", server.url, "--workload", "short",
             "--concurrency", str(clients), "--duration", str(seconds), "--warmup", str(warmup)],
            capture_output=True, text=True, check=True,
        )  # fmt: skip
    finally:
        server.stop()
    result = json.loads(done.stdout)
    return {
        "sentences_per_s": round(result["requests_per_s"], 1),
        "p99_ms": round(result["latency_ms"]["p99"], 1),
        "errors": sum(result["errors"].values()),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--warmup", type=float, default=2.0, help="seconds of the served load before it is measured")
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--api-servers", type=int, default=2)
    parser.add_argument(
        "--generator",
        choices=["wrk_load", "loadgen"],
        default="wrk_load" if shutil.which("wrk") else "loadgen",
        help="the closed-loop load generator (default: wrk where installed)",
    )
    parser.add_argument(
        "--sentences", type=int, default=0, help="the ceiling over the corpus' first N sentences (0: all 2,048)"
    )
    parser.add_argument("--flags", default="", help="more poolserve flags, one shell-quoted string")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    rounds = []
    for number in range(args.rounds):
        parts: dict[str, dict[str, object]] = {}
        for part in ("ceiling", "served") if number % 2 == 0 else ("served", "ceiling"):
            load = load_average()
            if part == "ceiling":
                figures = ceiling(args.seconds, args.sentences)
            else:
                flags = shlex.split(args.flags)
                figures = served(
                    args.seconds, args.clients, args.api_servers, args.generator, flags, warmup=args.warmup
                )
            parts[part] = {**figures, "load": load}
        share = float(parts["served"]["sentences_per_s"]) / float(parts["ceiling"]["sentences_per_s"])  # type: ignore[arg-type]
        rounds.append({"round": number + 1, **parts, "served_share": round(share, 3)})
        print(json.dumps(rounds[-1]), flush=True)
    if args.out:
        document = {"command": [Path(sys.executable).name, "-m", "bench.served_share", *sys.argv[1:]], "rounds": rounds}
        args.out.write_text(json.dumps(document, indent=1) + "\n")


if __name__ == "__main__":
    main()
