"""The engine's memory once it has served: what a server's model costs the host (issue 33's graph against torch).

    python -m bench.engine_memory [--variant ARGS]... [--rounds 2] [--out FILE]

Each variant (quoted `launch` flags; a leading `cwd=DIR` runs that checkout's code, a `git worktree` of another
commit) is first prepared (`launch prepare` with its flags, so that an ONNX graph it serves is cached and exported
by no engine), then started with one API server, given 20 lone sentences and three requests of 32 corpus sentences,
and its engine's memory read from /proc: VmRSS and VmHWM (the peak), and from smaps_rollup the proportional set (Pss:
pages shared with other processes counted in part), the private pages and the file-backed ones it has mapped. The
variants alternate for `--rounds`. Printed: one JSON line per run and the medians.
"""

from __future__ import annotations

import argparse
import json
import random
import shlex
import statistics
import subprocess
import sys
from pathlib import Path

import httpx

from bench.harness.corpus import make_sentence
from bench.harness.server_process import REPO, PoolserveProcess, cmdline, memory_mb, process_tree, role_of

SMAPS = {"Pss": "pss_mb", "Private_Clean": "private_clean_mb", "Private_Dirty": "private_dirty_mb",
         "Shared_Clean": "shared_clean_mb", "Anonymous": "anonymous_mb"}  # fmt: skip


def engine_memory(pid: int) -> dict[str, float]:
    values = {key: round(value, 1) for key, value in memory_mb(pid).items()}  # VmRSS and VmHWM
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        key, _, rest = line.partition(":")
        if key in SMAPS:
            values[SMAPS[key]] = round(int(rest.split()[0]) / 1024, 1)
    return values


def run(variant: str) -> dict[str, object]:
    words = shlex.split(variant)
    cwd = Path(words.pop(0).removeprefix("cwd=")) if words and words[0].startswith("cwd=") else REPO
    subprocess.run([sys.executable, "-m", "supervisor", "prepare", *words], cwd=cwd, check=True, capture_output=True)
    server = PoolserveProcess("--api-server-count", "1", *words, cwd=cwd)
    try:
        server.wait_ready(300)
        rng = random.Random(0)
        with httpx.Client(base_url=server.url, timeout=60) as client:
            for _ in range(20):
                client.post("/v1/embeddings", json={"input": make_sentence(rng)}).raise_for_status()
            for _ in range(3):
                batch = [make_sentence(rng) for _ in range(32)]
                client.post("/v1/embeddings", json={"input": batch}).raise_for_status()
        (engine,) = [pid for pid in process_tree(server.pid) if role_of(cmdline(pid)) == "engine"]
        return {"variant": variant, **engine_memory(engine)}
    finally:
        server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variant", action="append", required=True, help="Server flags ('' for the defaults).")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    rows = []
    for _ in range(args.rounds):
        for variant in args.variant:
            rows.append(run(variant))
            print(json.dumps(rows[-1]), flush=True)
    medians = {
        variant: {
            key: statistics.median(float(row[key]) for row in rows if row["variant"] == variant)  # type: ignore[arg-type]
            for key in rows[0]
            if key != "variant"
        }
        for variant in args.variant
    }
    print(json.dumps({"medians": medians}), flush=True)
    if args.out:
        args.out.write_text(json.dumps({"command": sys.argv, "runs": rows, "medians": medians}, indent=1))


if __name__ == "__main__":
    main()
