"""A chaos soak: mixed requests from many keep-alive clients, every answer checked against its reference,
while a driver signals the server's processes at random; memory and open descriptors of each sampled.

    nice -n 10 python -m bench.chaos_soak --minutes 10 --clients 16 --model tiny512

The requests (bench/harness/answer_check.py): /v1/embeddings of 1 and of 16 texts, /rerank of 8 documents, TEI's
/embed, /tokenize in two shapes, each with a reference answer from one unfaulted pass at the start. The
faults, one at a time at random intervals, each kind once a round in a random order: kill -9 of a random
API server or of the engine, SIGHUP (rolling restart), SIGTTIN (and SIGTTOU the next round), SIGSTOP then
SIGCONT of a random child. A client resends a request that met a dropped connection or a 429/502/503/504
(as a balancer would: pooling is a pure function of its input), up to 5 tries. The result counts requests
sent, failed (no right answer after those tries), mixed up (an answer that is not its request's: must be
0), retried, and each process's RSS and descriptors, first sample to last. Written to
bench/results/chaos-soak-<time>.json and printed.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import signal
import threading
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from bench.fault_soak import inject, write_results
from bench.harness.answer_check import Entry, build_catalogue, differences
from bench.harness.models import MODEL_KINDS, model_folder
from bench.harness.server_process import (
    PoolserveProcess,
    cmdline,
    memory_mb,
    process_tree,
    role_of,
    start_poolserve,
    wait_until,
)

FAULTS = ("kill-api-server", "kill-engine", "sighup", "ttin-ttou", "stop-cont")
RETRIED_STATUSES = frozenset({429, 502, 503, 504})
ATTEMPTS = 5


@dataclass
class Tally:
    """What the clients saw, under one lock."""

    sent: int = 0
    ok: int = 0
    retried: int = 0
    failed: list[str] = field(default_factory=list)
    mixed_up: list[str] = field(default_factory=list)
    retry_reasons: Counter[str] = field(default_factory=Counter)
    by_kind: Counter[str] = field(default_factory=Counter)


def reference_answers(url: str, catalogue: Sequence[Entry]) -> list[Any]:
    """Each entry's answer from one client, one request at a time, before any fault."""
    answers = []
    with httpx.Client(base_url=url, timeout=60) as client:
        for entry in catalogue:
            response = client.post(entry.path, json=entry.body)
            response.raise_for_status()
            answers.append(response.json())
    return answers


class CheckedLoad:
    """`clients` threads, each on one keep-alive connection, sending random catalogue entries back to back
    and checking each answer against its reference, until stopped."""

    def __init__(self, url: str, catalogue: Sequence[Entry], references: Sequence[Any], clients: int, seed: int):
        self.url = url
        self.catalogue = catalogue
        self.references = references
        self.tally = Tally()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._client, args=(random.Random(seed * 1000 + index),), daemon=True)
            for index in range(clients)
        ]

    def __enter__(self) -> CheckedLoad:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=ATTEMPTS * 70)

    def _client(self, rng: random.Random) -> None:
        with httpx.Client(base_url=self.url, timeout=60) as client:
            while not self._stop.is_set():
                index = rng.randrange(len(self.catalogue))
                self._send(client, index)

    def _send(self, client: httpx.Client, index: int) -> None:
        entry = self.catalogue[index]
        reasons: list[str] = []
        outcome = ""
        for attempt in range(ATTEMPTS):
            if attempt:
                time.sleep(0.1 * attempt)
            try:
                response = client.post(entry.path, json=entry.body)
            except httpx.TransportError as exc:
                reasons.append(type(exc).__name__)
                continue
            if response.status_code in RETRIED_STATUSES:
                reasons.append(f"HTTP {response.status_code}")
                continue
            if response.status_code != 200:
                outcome = f"HTTP {response.status_code}: {response.text[:200]}"
                break
            found = differences(response.json(), self.references[index])
            outcome = f"entry {index} ({entry.kind}): {found[0]}" if found else "ok"
            break
        with self._lock:
            tally = self.tally
            tally.sent += 1
            tally.by_kind[entry.kind] += 1
            tally.retried += bool(reasons)
            tally.retry_reasons.update(reasons)
            if outcome == "ok":
                tally.ok += 1
            elif outcome.startswith("entry"):
                tally.mixed_up.append(outcome)
            else:
                tally.failed.append(outcome or f"entry {index}: gave up after {', '.join(reasons)}")


def process_age(pid: int) -> float:
    """Seconds since `pid` started, from /proc (its start time in clock ticks since boot)."""
    ticks = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
    uptime = float(Path("/proc/uptime").read_text().split()[0])
    return uptime - ticks / os.sysconf("SC_CLK_TCK")


class ProcessSampler:
    """Every `every` seconds, the RSS and open descriptors of each process of the server; per process, the
    first sample once it is `warm_after` seconds old (a process still booting grows by its imports) and the
    last."""

    def __init__(self, supervisor: int, every: float, warm_after: float):
        self.supervisor = supervisor
        self.every = every
        self.warm_after = warm_after
        self.samples: dict[int, dict[str, Any]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> ProcessSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.sample()

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            self.sample()

    def sample(self) -> None:
        now = time.monotonic()
        for pid in process_tree(self.supervisor):
            rss = memory_mb(pid).get("rss_mb")
            with contextlib.suppress(OSError, IndexError, ValueError):
                fds = len(os.listdir(f"/proc/{pid}/fd"))
                if rss is None or process_age(pid) < self.warm_after:
                    continue
                point = {"at": now, "rss_mb": round(rss, 1), "fds": fds}
                row = self.samples.setdefault(pid, {"role": role_of(cmdline(pid)), "first": point})
                row["last"] = point

    def growth(self) -> list[dict[str, Any]]:
        rows = []
        for pid, row in sorted(self.samples.items(), key=lambda item: (item[1]["role"], item[0])):
            first, last = row["first"], row["last"]
            rss_growth = round(last["rss_mb"] - first["rss_mb"], 1)
            rows.append({
                "pid": pid, "role": row["role"], "sampled_s": round(last["at"] - first["at"], 1),
                "rss_mb": [first["rss_mb"], last["rss_mb"]], "rss_growth_mb": rss_growth,
                "fds": [first["fds"], last["fds"]], "fd_growth": last["fds"] - first["fds"],
            })  # fmt: skip
        return rows


class FaultDriver:
    """Sends one random fault at a time to the right process, then waits for the server to be whole again."""

    def __init__(self, server: PoolserveProcess, kinds: Sequence[str], rng: random.Random):
        self.server = server
        self.kinds = list(kinds)
        self.rng = rng
        self.scaled_up = False
        self._bag: list[str] = []
        self._kills: dict[str, list[float]] = {}

    def next_kind(self) -> str:
        """Each kind once per round, in a random order: any run of len(kinds) faults has them all. A kill
        waits for a later turn while 3 of its kind fell within the last minute: the supervisor gives up on
        a child that crashes 5 times in 60 s (supervisor/restart_policy.py), by design."""
        while True:
            if not self._bag:
                self._bag = self.rng.sample(self.kinds, len(self.kinds))
            kind = self._bag.pop()
            now = time.monotonic()
            recent = [at for at in self._kills.get(kind, []) if now - at < 60]
            if not kind.startswith("kill") or len(recent) < 3 or len(self.kinds) == 1:
                self._kills[kind] = [*recent, now]
                return kind

    def inject(self, kind: str) -> str:
        server, rng = self.server, self.rng
        if kind in ("kill-api-server", "kill-engine", "sighup"):
            return inject(server, kind)
        if kind == "ttin-ttou":
            # Up one, then back down: the count stays where the run started, whatever the draw.
            self.scaled_up = not self.scaled_up
            server.proc.send_signal(signal.SIGTTIN if self.scaled_up else signal.SIGTTOU)
            return "SIGTTIN" if self.scaled_up else "SIGTTOU"
        children = server.child_pid("apiserver") + server.child_pid("engine_core")
        if not children:
            return "SIGSTOP: no child to stop"
        pid = rng.choice(children)
        paused = rng.uniform(0.5, 3.0)
        os.kill(pid, signal.SIGSTOP)
        time.sleep(paused)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)
        return f"SIGSTOP {role_of(cmdline(pid)) or pid} {pid} for {paused:.1f}s, SIGCONT"

    def settle(self) -> bool:
        def is_whole() -> bool:
            with contextlib.suppress(httpx.HTTPError), httpx.Client(base_url=self.server.url, timeout=5) as client:
                return client.get("/health").status_code == 200 and bool(self.server.child_pid("engine_core"))
            return False

        return wait_until(is_whole, 120, interval=0.2)


def run_soak(
    seconds: float,
    clients: int,
    interval: tuple[float, float],
    *,
    kinds: Sequence[str] = FAULTS,
    server_args: Sequence[str] = ("--api-server-count", "2", "--device", "cpu", "--dtype", "float32"),
    seed: int = 0,
    sample_every: float = 5.0,
    per_kind: int = 24,
    warm_after: float = 20.0,
) -> dict[str, Any]:
    """The soak as a function (the CLI's and tests/bench/test_chaos_soak.py's): the report as a dict."""
    rng = random.Random(seed)
    catalogue = build_catalogue(seed, per_kind)
    server = start_poolserve(list(server_args))
    faults: list[dict[str, Any]] = []
    try:
        references = reference_answers(server.url, catalogue)
        driver = FaultDriver(server, kinds, rng)
        started = time.monotonic()
        deadline = started + seconds
        with ProcessSampler(server.pid, sample_every, warm_after) as sampler:
            with CheckedLoad(server.url, catalogue, references, clients, seed) as load:
                while time.monotonic() + interval[0] < deadline and server.proc.poll() is None:
                    time.sleep(rng.uniform(*interval))
                    kind = driver.next_kind()
                    what = driver.inject(kind)
                    at = round(time.monotonic() - started, 1)
                    faults.append({"at": at, "kind": kind, "fault": what, "whole_again": driver.settle()})
                time.sleep(max(0.0, deadline - time.monotonic()))
            elapsed = time.monotonic() - started
        supervisor_alive = server.proc.poll() is None
        log_tail = server.tail(40)
    finally:
        server.stop()
    tally = load.tally
    return {
        "seconds": round(elapsed, 1),
        "clients": clients,
        "server_args": list(server_args),
        "catalogue": dict(Counter(entry.kind for entry in catalogue)),
        "sent": tally.sent,
        "ok": tally.ok,
        "failed": len(tally.failed),
        "mixed_up": len(tally.mixed_up),
        "retried": tally.retried,
        "retry_reasons": dict(tally.retry_reasons),
        "by_kind": dict(tally.by_kind),
        "failures": tally.failed[:20],
        "mix_ups": tally.mixed_up[:20],
        "fault_counts": dict(Counter(fault["kind"] for fault in faults)),
        "faults": faults,
        "supervisor_alive_at_end": supervisor_alive,
        "log_tail": log_tail if not supervisor_alive else "",
        "processes": sampler.growth(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--api-servers", type=int, default=2)
    parser.add_argument("--model", default="bundled", choices=MODEL_KINDS, help="bench/harness/models.py's kind")
    parser.add_argument("--min-interval", type=float, default=4.0, help="fewest seconds between faults")
    parser.add_argument("--max-interval", type=float, default=12.0, help="most seconds between faults")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    model = str(model_folder(args.model))
    server_args = (
        "--api-server-count",
        str(args.api_servers),
        "--device",
        "cpu",
        "--dtype",
        "float32",
        "--model",
        model,
    )
    report = run_soak(
        args.minutes * 60, args.clients, (args.min_interval, args.max_interval), server_args=server_args, seed=args.seed
    )
    report["command"] = (
        f"python -m bench.chaos_soak --minutes {args.minutes} --clients {args.clients} --model {args.model} "
        f"--api-servers {args.api_servers} --seed {args.seed}"
    )
    write_results("chaos-soak", report)


if __name__ == "__main__":
    main()
