"""Cores each poolserve process uses per request served: the engine's waiting cost at light load.

    python -m bench.cpu_use [--clients 1,8,32] [--seconds 10] [--api-servers 1] [--variant ARGS]...

Starts a server per variant (each `--variant` is extra `launch` flags, quoted; the first run is
the defaults; a leading `cwd=DIR` runs that checkout's code, a `git worktree` of another commit),
drives workload (a) (one sentence per request) with bench.loadgen in a closed loop at each client
count (0: no load, the server idle), and reads every server process's CPU time from /proc over the
measured window (from the end of the warm-up that follows the engine's first pass under the load).
Printed per run: requests/s, p99, and cores used by the engine, the API servers and the load
generator. An engine that spins its threads between small batches shows as engine cores
well above what its forward passes need at one client. docs/benchmarks.md, "CPU engine", holds
the figures and the command.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

from bench.harness.polling import poll_until
from bench.harness.scrape import scrape, total
from bench.harness.server_process import REPO, PoolserveProcess, cmdline, process_tree, role_of

TICKS = os.sysconf("SC_CLK_TCK")


def stat_seconds(stat: str) -> float:
    """User plus system CPU seconds from the text of a /proc stat file (a process's or one thread's)."""
    fields = stat.rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def cpu_seconds(pid: int) -> float:
    """User plus system CPU seconds of a process, all its threads, from /proc/<pid>/stat."""
    try:
        return stat_seconds(Path(f"/proc/{pid}/stat").read_text())
    except OSError:
        return 0.0


def thread_cpu(pid: int) -> dict[str, float]:
    """User plus system CPU seconds of each thread of a process, from /proc/<pid>/task: the main thread as
    `main`, the others by their name (`python` for a Python thread, `ZMQbg/IO/0` for ZeroMQ's), numbered in
    the order they started where names repeat."""
    named: dict[str, float] = {}
    try:
        tids = sorted(int(tid) for tid in os.listdir(f"/proc/{pid}/task"))
    except OSError:
        return named
    for tid in tids:
        try:
            stat = Path(f"/proc/{pid}/task/{tid}/stat").read_text()
        except OSError:
            continue
        name = "main" if tid == pid else stat[stat.index("(") + 1 : stat.rindex(")")]
        label, n = name, 1
        while label in named:
            n += 1
            label = f"{name}-{n}"
        named[label] = stat_seconds(stat)
    return named


def cpu_by_role(root: int) -> dict[str, float]:
    totals: dict[str, float] = {}
    for pid in process_tree(root):
        role = role_of(cmdline(pid))
        totals[role] = totals.get(role, 0.0) + cpu_seconds(pid)
    return totals


def idle(root: int, seconds: float, warmup: float) -> dict[str, object]:
    """The server's CPU with no load at all, over `seconds` after `warmup`."""
    time.sleep(warmup)
    before, started = cpu_by_role(root), time.monotonic()
    time.sleep(seconds)
    after, window = cpu_by_role(root), time.monotonic() - started
    cores = {role: round((after.get(role, 0.0) - before.get(role, 0.0)) / window, 4) for role in after}
    return {"clients": 0, "requests_per_s": 0.0, "cores": cores}


def wait_for_passes(url: str, passes: float, timeout: float = 60.0) -> None:
    """Until the engine has run a pass since it had run `passes` (its /metrics): the load has reached it."""
    if not poll_until(lambda: total(scrape(url), "poolserve_batch_inputs_count") > passes, timeout):
        raise SystemExit(f"no forward pass within {timeout:.0f} s of starting the load")


def measure(url: str, root: int, clients: int, seconds: float, warmup: float) -> dict[str, object]:
    """One closed-loop run; the server's CPU is sampled over (about) loadgen's measured window."""
    if clients == 0:
        return idle(root, seconds, warmup)
    argv = [sys.executable, "-m", "bench.loadgen", "--url", url, "--workload", "a", "--concurrency", str(clients),
            "--duration", str(seconds), "--warmup", str(warmup), "--prober-interval", "0"]  # fmt: skip
    passes = total(scrape(url), "poolserve_batch_inputs_count")
    loadgen = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
    # loadgen's own start-up: ~0.5 s on the AVX512 host; on a slower one a fixed 0.5 s wait read no load at all
    wait_for_passes(url, passes)
    time.sleep(warmup)
    before, started = cpu_by_role(root), time.monotonic()
    time.sleep(seconds - 1.0)
    after, window = cpu_by_role(root), time.monotonic() - started
    out, _ = loadgen.communicate(timeout=seconds + 60)
    result = json.loads(out.splitlines()[-1])
    cores = {role: round((after.get(role, 0.0) - before.get(role, 0.0)) / window, 3) for role in after}
    return {
        "clients": clients,
        "requests_per_s": round(result["requests_per_s"], 1),
        "p99_ms": round(result["latency_ms"]["p99"], 1),
        "cores": cores,
        "generator_cores": round(result["generator"]["cpu_share"], 3),
        "errors": result["errors"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", default="1,8,32")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--warmup", type=float, default=2.0)
    parser.add_argument("--api-servers", type=int, default=1)
    parser.add_argument(
        "--variant",
        action="append",
        default=None,
        help="Extra launch flags, quoted; NAME=value words set the environment.",
    )
    parser.add_argument("--rounds", type=int, default=1, help="Repeat every variant, alternating, this many times.")
    args = parser.parse_args()
    variants = [""] + (args.variant or [])
    counts = [int(c) for c in args.clients.split(",")]
    for _ in range(args.rounds):
        for variant in variants:
            run_variant(variant, args, counts)


def run_variant(variant: str, args: argparse.Namespace, counts: list[int]) -> None:
    words = shlex.split(variant)
    cwd = Path(words.pop(0).removeprefix("cwd=")) if words and words[0].startswith("cwd=") else REPO
    env = dict(word.split("=", 1) for word in words if "=" in word and not word.startswith("-"))
    flags = [word for word in words if not ("=" in word and not word.startswith("-"))]
    server = PoolserveProcess("--api-server-count", str(args.api_servers), *flags, env=env, cwd=cwd)
    try:
        server.wait_ready(300)
        for clients in counts:
            row = measure(server.url, server.pid, clients, args.seconds, args.warmup)
            print(json.dumps({"variant": variant or "defaults", "load_average": os.getloadavg()[0], **row}), flush=True)
    finally:
        server.stop()


if __name__ == "__main__":
    main()
