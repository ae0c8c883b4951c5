"""A long fault run: steady load while faults are injected on a schedule; every request is counted.

    python -m bench.fault_soak --minutes 5 --clients 8 --api-servers 2

Prints (and writes under bench/results/) how many requests were sent, how many failed and why,
and each fault with the failures that followed it within a few seconds.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import signal
import time
from collections import Counter
from pathlib import Path

import httpx

from bench.harness.server_process import PoolserveProcess, start_poolserve, wait_until
from bench.harness.steady_load import SteadyLoad

FAULTS = ("kill-api-server", "kill-engine", "sighup", "scale-up-down")


def soak_body(rng: random.Random) -> dict[str, object]:
    """1, 4 or 16 sentences, each unlikely to repeat (so no cache could answer it)."""
    return {"input": [f"soak sentence {rng.randint(0, 10**6)} about search" for _ in range(rng.choice((1, 4, 16)))]}


def inject(server: PoolserveProcess, fault: str) -> str:
    if fault == "kill-api-server":
        pid = random.choice(server.child_pid("apiserver"))
        os.kill(pid, signal.SIGKILL)
        return f"kill -9 API server {pid}"
    if fault == "kill-engine":
        (pid,) = server.child_pid("engine_core")
        os.kill(pid, signal.SIGKILL)
        return f"kill -9 engine {pid}"
    if fault == "sighup":
        server.proc.send_signal(signal.SIGHUP)
        return "SIGHUP (rolling restart)"
    count = len(server.child_pid("apiserver"))
    server.proc.send_signal(signal.SIGTTIN)
    wait_until(lambda: len(server.child_pid("apiserver")) == count + 1, 30)
    time.sleep(2)
    server.proc.send_signal(signal.SIGTTOU)
    return "SIGTTIN then SIGTTOU"


def settle(server: PoolserveProcess) -> None:
    """Wait until the server is whole again: an engine answering, every API server up."""
    with httpx.Client(base_url=server.url, timeout=10) as client:
        wait_until(lambda: client.get("/health").status_code == 200, 120, interval=0.2)


def write_results(name: str, report: dict[str, object]) -> Path:
    """`report` printed, and written to bench/results/<name>-<time>.json (that path returned)."""
    out = Path("bench/results") / f"{name}-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2))
    print(json.dumps(report, indent=2))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=5.0)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--api-servers", type=int, default=2)
    parser.add_argument("--interval", type=float, default=15.0, help="seconds between faults")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    random.seed(args.seed)
    server = start_poolserve(["--api-server-count", str(args.api_servers)])
    started = time.monotonic()
    faults: list[tuple[float, str]] = []
    try:
        with SteadyLoad(server.url, clients=args.clients, body=soak_body, timeout=120) as load:
            deadline = started + args.minutes * 60
            schedule = iter(FAULTS * 1000)
            while time.monotonic() + args.interval < deadline:
                time.sleep(args.interval)
                fault = next(schedule)
                faults.append((time.monotonic() - started, inject(server, fault)))
                settle(server)
            time.sleep(max(0.0, deadline - time.monotonic()))
    finally:
        log = server.stderr()
        server.stop()
    misses = [(at - started, what) for at, what in load.misses]
    report = {
        "minutes": args.minutes,
        "clients": args.clients,
        "api_servers": args.api_servers,
        "sent": load.total,
        "ok": load.statuses[200],
        "statuses": dict(load.statuses),
        "connection_errors": dict(Counter(name for _, name in load.failures)),
        "poison_pills": len(re.findall("failing it as the cause", log)),
        "faults": [
            {"at": round(at, 1), "fault": what, "failures_within_5s": [w for t, w in misses if 0 <= t - at < 5]}
            for at, what in faults
        ],
    }
    write_results("fault-soak", report)


if __name__ == "__main__":
    main()
