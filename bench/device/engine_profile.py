"""Where the engine's time goes under a served load: py-spy on the engine (and one API server) of one server.

    python3 bench/device/engine_profile.py OUT_DIR [--device cuda] [--api-servers 8] [--clients 256] [--workload short]

Starts `launch --device D --api-server-count N`, drives it with bench.wrk_load for the whole run, and records
py-spy (carried by bench/device/prepare.sh) for 8 s each: the engine's threads as sampled (wall time of every
thread not idle), the engine holding the GIL only (`--gil`: its Python CPU), and the first API server. Raw
collapsed stacks land in OUT_DIR as engine-wall.txt, engine-gil.txt and apiserver.txt, with the load's summary in
load.json; `python3 bench/device/engine_profile.py --summary FILE` prints a profile's top functions, self and
cumulative. Made for the GPU question of docs/benchmarks.md ("Served on the GPU after the batching fix"): why a
served pass takes 2-3 x the offline one.
"""

from __future__ import annotations

import argparse
import collections
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

from bench.harness.server_process import PoolserveProcess, cmdline, process_tree, role_of

SECONDS = 8


def record(pid: int, out: Path, *extra: str) -> None:
    subprocess.run(
        ["py-spy", "record", "--pid", str(pid), "--rate", "250", "--duration", str(SECONDS), "--format", "raw",
         "--output", str(out), "--nonblocking", "--threads", *extra],
        check=False, capture_output=True, timeout=SECONDS + 60,
    )  # fmt: skip


def summary(path: Path, top: int = 25) -> str:
    """A raw profile's top functions by self and cumulative share of its samples (files shortened to their names)."""
    own: collections.Counter[str] = collections.Counter()
    inside: collections.Counter[str] = collections.Counter()
    total = 0
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        samples = int(count)
        total += samples
        frames = [re.sub(r" \((?:.*/)?([^/]*)\)$", r" (\1)", f) for f in stack.split(";")[1:]]  # 0: the thread
        if frames:
            own[frames[-1]] += samples
            for frame in set(frames):
                inside[frame] += samples
    lines = [f"{path.name}: {total} samples"]
    for title, counter in (("self", own), ("cumulative", inside)):
        lines.append(f"-- {title}")
        lines += [f"{100 * n / max(total, 1):5.1f}% {name}" for name, n in counter.most_common(top)]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, nargs="?")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--api-servers", type=int, default=8)
    parser.add_argument("--clients", type=int, default=256)
    parser.add_argument("--workload", default="short")
    parser.add_argument("--summary", type=Path, help="print this raw profile's top functions and stop")
    args = parser.parse_args()
    if args.summary:
        print(summary(args.summary))
        return
    if args.out is None or shutil.which("py-spy") is None or shutil.which("wrk") is None:
        raise SystemExit("needs OUT_DIR, and py-spy and wrk on PATH (bench/device/prepare.sh carries both)")
    args.out.mkdir(parents=True, exist_ok=True)
    server = PoolserveProcess("--device", args.device, "--api-server-count", str(args.api_servers))
    try:
        server.wait_ready(300)
        roles: dict[str, int] = {}
        for pid in process_tree(server.pid):
            roles.setdefault(role_of(cmdline(pid)), pid)
        seconds = 2 + 3 * (SECONDS + 2)
        load = subprocess.Popen(
            [sys.executable, "-m", "bench.wrk_load", "--url", server.url, "--workload", args.workload,
             "--concurrency", str(args.clients), "--duration", str(seconds), "--warmup", "0"],
            stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        time.sleep(2)
        record(roles["engine"], args.out / "engine-wall.txt")
        record(roles["engine"], args.out / "engine-gil.txt", "--gil")
        record(roles["apiserver"], args.out / "apiserver.txt")
        (args.out / "load.json").write_text(load.communicate(timeout=seconds + 60)[0])
    finally:
        server.stop()
    for name in ("engine-wall.txt", "engine-gil.txt", "apiserver.txt"):
        if (args.out / name).exists():
            print(summary(args.out / name, top=15))


if __name__ == "__main__":
    main()
