"""How long the model is away after its engine dies: `kill -9` the engine, then time the restart.

    python -m bench.engine_restart --kills 3 [--cwd WORKTREE] [--out FILE] [-- launch flags]

For each kill: `ready_s`, from the kill to the supervisor's "engine (pid N) is ready" line, less the back-off the
supervisor said it waited before starting the engine again ("restarting it in 0.5s": each further crash within 60 s
doubles it); `answered_s`, from the kill to the first 200 of a request sent every 20 ms (back-off included); and
whether the engine was forked from the engine template (engine_core/template.py) or started as a fresh interpreter.
`--cwd`: the checkout whose server runs (a `git worktree` of an earlier commit, for a before and after in one run).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import httpx

from bench.harness.server_process import PoolserveProcess, wait_until

REPO = Path(__file__).resolve().parent.parent
READY = re.compile(r"engine \(pid (\d+)\) is ready(, forked)?")
BACKOFF = re.compile(r"engine \(pid \d+\) was killed by SIGKILL; restarting it(?: in ([\d.]+)s)?")


@dataclass
class Restart:
    ready_s: float
    answered_s: float
    backoff_s: float
    forked: bool


def restart_once(server: PoolserveProcess, client: httpx.Client) -> Restart:
    (engine,) = server.child_pid("engine_core")
    mark = len(server.stderr())
    killed = time.monotonic()
    os.kill(engine, signal.SIGKILL)
    ready_at = answered_at = 0.0
    found: re.Match[str] | None = None
    deadline = killed + 120
    while time.monotonic() < deadline and not (ready_at and answered_at):
        if not ready_at:
            found = next((m for m in READY.finditer(server.stderr()[mark:]) if int(m.group(1)) != engine), None)
            if found:
                ready_at = time.monotonic()
        if not answered_at:
            try:
                if client.post("/v1/embeddings", json={"input": "back?"}).status_code == 200:
                    answered_at = time.monotonic()
            except httpx.HTTPError:
                pass
        time.sleep(0.02)
    if not (ready_at and answered_at and found):
        raise RuntimeError(f"the engine was not back within 120 s\n{server.log()}")
    backoff = BACKOFF.search(server.stderr()[mark:])
    waited = float(backoff.group(1)) if backoff and backoff.group(1) else 0.0
    return Restart(
        ready_s=round(ready_at - killed - waited, 3),
        answered_s=round(answered_at - killed, 3),
        backoff_s=waited,
        forked=found.group(2) is not None,
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kills", type=int, default=3, help="engine kills, one after the other (at most 5: the 6th "
                        "crash within 60 s makes the supervisor give up)")  # fmt: skip
    parser.add_argument("--cwd", type=Path, default=REPO, help="the checkout whose server runs")
    parser.add_argument("--out", type=Path, help="also write the result here, as JSON")
    parser.add_argument("launch", nargs="*", help="launch's flags (after --)")
    args = parser.parse_args(argv)
    if not 1 <= args.kills <= 5:
        parser.error("--kills is 1 to 5")
    server = PoolserveProcess("--api-server-count", "1", *args.launch, cwd=args.cwd)
    try:
        server.wait_ready(300)
        with httpx.Client(base_url=server.url, timeout=30) as client:
            assert wait_until(lambda: client.get("/health").status_code == 200, 60), server.log()
            kills = [restart_once(server, client) for _ in range(args.kills)]
    finally:
        server.stop()
    result = {
        "cwd": str(args.cwd),
        "launch": args.launch,
        "kills": [asdict(kill) for kill in kills],
        "median_ready_s": statistics.median(kill.ready_s for kill in kills),
    }
    print(json.dumps(result, indent=1))
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
