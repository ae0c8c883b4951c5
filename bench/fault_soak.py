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
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from bench.server_process import PoolserveProcess, start_poolserve, wait_until

FAULTS = ("kill-api-server", "kill-engine", "sighup", "scale-up-down")


@dataclass
class Tally:
    statuses: Counter[int] = field(default_factory=Counter)
    errors: Counter[str] = field(default_factory=Counter)
    # (seconds since start, what) of each failure
    failures: list[tuple[float, str]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)


def client_loop(url: str, stop: threading.Event, tally: Tally, started: float, seed: int) -> None:
    rng = random.Random(seed)
    with httpx.Client(base_url=url, timeout=120) as client:
        while not stop.is_set():
            body = {
                "input": [f"soak sentence {rng.randint(0, 10**6)} about search" for _ in range(rng.choice((1, 4, 16)))]
            }
            try:
                status = client.post("/v1/embeddings", json=body).status_code
            except httpx.HTTPError as exc:
                with tally.lock:
                    tally.errors[type(exc).__name__] += 1
                    tally.failures.append((time.monotonic() - started, type(exc).__name__))
                continue
            with tally.lock:
                tally.statuses[status] += 1
                if status != 200:
                    tally.failures.append((time.monotonic() - started, f"HTTP {status}"))


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
    tally, stop, started = Tally(), threading.Event(), time.monotonic()
    faults: list[tuple[float, str]] = []
    threads = [
        threading.Thread(target=client_loop, args=(server.url, stop, tally, started, i), daemon=True)
        for i in range(args.clients)
    ]
    try:
        for thread in threads:
            thread.start()
        deadline = started + args.minutes * 60
        schedule = iter(FAULTS * 1000)
        while time.monotonic() + args.interval < deadline:
            time.sleep(args.interval)
            fault = next(schedule)
            faults.append((time.monotonic() - started, inject(server, fault)))
            settle(server)
        time.sleep(max(0.0, deadline - time.monotonic()))
    finally:
        stop.set()
        for thread in threads:
            thread.join(130)
        log = server.stderr()
        server.stop()
    sent = sum(tally.statuses.values()) + sum(tally.errors.values())
    report = {
        "minutes": args.minutes,
        "clients": args.clients,
        "api_servers": args.api_servers,
        "sent": sent,
        "ok": tally.statuses[200],
        "statuses": dict(tally.statuses),
        "connection_errors": dict(tally.errors),
        "poison_pills": len(re.findall("failing it as the cause", log)),
        "faults": [
            {"at": round(at, 1), "fault": what, "failures_within_5s": [w for t, w in tally.failures if 0 <= t - at < 5]}
            for at, what in faults
        ],
    }
    out = Path("bench/results") / f"fault-soak-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2))
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
