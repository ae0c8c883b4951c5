"""The load generator: closed or open loop against one loopback server, with a /health prober beside it.

Run it in its own process (the sweep does), so that it never shares a GIL with what it measures:

    python -m bench.loadgen --url http://127.0.0.1:8000 --workload a --concurrency 32 --duration 10
    python -m bench.loadgen --url ... --workload c --rate 200 --duration 10       # open loop, Poisson
    python -m bench.loadgen --target trivial --workload trivial --concurrency 32  # the generator's ceiling

It prints one JSON object: requests/s, items/s, tokens/s (from the responses' `usage`), latency
percentiles, errors by status, the prober's latencies, each API server's share of the replies
(`x-poolserve-server`), and the generator's own CPU use, so a saturated generator shows itself.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ipaddress
import itertools
import json
import resource
import socket
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import msgspec

from bench.harness.clients import CLIENT_KINDS, Client, Reply, Request, make_client, prepare_request
from bench.harness.prober import Prober
from bench.harness.schedule import poisson_arrivals
from bench.harness.stats import count_by, rate, shares, summarize_latencies
from bench.harness.workloads import Workload, build_workload

DRAIN_TIMEOUT_S = 30.0
# Below this many replies in the window, percentiles and rates say little: the run was too short
# for the server's latency (at C clients a run needs several round trips of C requests).
FEW_REPLIES = 30
# Above this share of one core, the generator may be what limits the figure.
BUSY_GENERATOR = 0.8


class Usage(msgspec.Struct):
    prompt_tokens: int = 0
    total_tokens: int = 0


class UsageOnly(msgspec.Struct):
    """The one field of a reply the report reads; msgspec skips the rest without building it."""

    usage: Usage | None = None


USAGE_DECODER = msgspec.json.Decoder(UsageOnly)


def tokens_of(body: bytes) -> int:
    try:
        usage = USAGE_DECODER.decode(body).usage
    except msgspec.DecodeError:
        return 0  # a reply without OpenAI's usage (a list, an error body)
    return usage.prompt_tokens or usage.total_tokens if usage is not None else 0


@dataclass(slots=True)
class Tally:
    """What completed inside the measured window."""

    latencies: list[float] = field(default_factory=list)
    statuses: Counter[str] = field(default_factory=Counter)
    servers: Counter[str] = field(default_factory=Counter)
    items: int = 0
    tokens: int = 0
    dispatch_lags: list[float] = field(default_factory=list)

    @property
    def ok(self) -> int:
        return self.statuses["200"]


class Run:
    """One bounded run: a warm-up, then a window that ends at a deadline or after a count."""

    def __init__(self, workload: Workload, requests: list[Request], warmup: float, duration: float, limit: int):
        self.workload = workload
        self.requests = requests
        self.next_index = itertools.count()
        self.started = time.monotonic()
        self.window_start = self.started + warmup
        self.deadline = self.window_start + duration
        self.window_end = self.deadline
        self.limit = limit
        self.tally = Tally()
        self.count_tokens = workload.method == "POST"

    @property
    def should_stop(self) -> bool:
        return time.monotonic() >= self.window_end

    def next_request(self) -> Request:
        return self.requests[next(self.next_index) % len(self.requests)]

    def record(self, reply: Reply | None, error: str, sent: float, done: float) -> None:
        if not self.window_start <= done <= self.window_end:
            return
        tally = self.tally
        if reply is None:
            tally.statuses[error] += 1
            return
        tally.statuses[str(reply.status)] += 1
        if reply.status != 200:
            return
        tally.latencies.append(done - sent)
        tally.servers[reply.server or "-"] += 1
        tally.items += self.workload.items_per_request
        if self.count_tokens:
            tally.tokens += tokens_of(reply.body)
        if self.limit and tally.ok >= self.limit:
            # The count bound: the window closes at the limit-th success.
            self.window_end = done


async def send_one(client: Client, request: Request, run: Run, due: float) -> None:
    reply: Reply | None = None
    error = ""
    try:
        reply = await client.send(request)
    except Exception as exc:
        error = type(exc).__name__
    run.record(reply, error, due, time.monotonic())


async def closed_worker(client: Client, run: Run) -> None:
    while not run.should_stop:
        await send_one(client, run.next_request(), run, time.monotonic())


async def run_closed(client: Client, run: Run, concurrency: int) -> None:
    workers = [asyncio.create_task(closed_worker(client, run)) for _ in range(concurrency)]
    await finish(workers, run)


async def run_open(client: Client, run: Run, arrivals: list[float], max_in_flight: int) -> None:
    """Requests start at their scheduled times whatever the server's pace. Latency is measured from
    the scheduled time, so a generator or a connection cap that falls behind shows as latency
    (no coordinated omission), and the dispatch lag is reported too."""
    slots = asyncio.Semaphore(max_in_flight)
    tasks: set[asyncio.Task[None]] = set()

    async def one(due: float) -> None:
        async with slots:
            if run.window_start <= due:
                run.tally.dispatch_lags.append(time.monotonic() - due)
            await send_one(client, run.next_request(), run, due)

    for offset in arrivals:
        due = run.started + offset
        if due >= run.window_end:
            break
        delay = due - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        if run.should_stop:
            break
        task = asyncio.create_task(one(due))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
    await finish(list(tasks), run)


async def finish(tasks: list[asyncio.Task[None]], run: Run) -> None:
    """Wait for the window to close, then give in-flight requests a bounded time to end."""
    while not run.should_stop and any(not t.done() for t in tasks):
        await asyncio.sleep(min(0.05, max(0.0, run.window_end - time.monotonic())))
    _, pending = await asyncio.wait(tasks, timeout=DRAIN_TIMEOUT_S) if tasks else (set(), set())
    if pending:
        # A request with no answer DRAIN_TIMEOUT_S after the window closed is a lost one, not a slow one: counted as
        # an error, so a run that waited it out does not read as a clean run that merely took 30 s longer.
        run.tally.statuses["unanswered"] += len(pending)
        print(f"loadgen: {len(pending)} unanswered {DRAIN_TIMEOUT_S:.0f} s after its window", file=sys.stderr)
    for task in pending:
        task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await asyncio.gather(*pending, return_exceptions=True)


def check_loopback(url: str) -> None:
    """Load goes to this machine only: the URL's host must resolve to loopback addresses."""
    host = urlsplit(url).hostname or ""
    try:
        addresses = {str(info[4][0]) for info in socket.getaddrinfo(host, None)}
    except OSError as exc:
        raise SystemExit(f"--url host {host!r} does not resolve: {exc}") from exc
    for address in addresses:
        if not ipaddress.ip_address(address.split("%")[0]).is_loopback:
            raise SystemExit(f"--url {url} resolves to {address}, which is not loopback; the generator refuses.")


async def generate(args: argparse.Namespace, workload: Workload) -> dict[str, object]:
    parts = urlsplit(args.url)
    host = f"{parts.hostname}:{parts.port}" if parts.port else str(parts.hostname)
    requests = [prepare_request(workload.method, args.path or workload.path, body, host) for body in workload.bodies]
    is_open = args.rate > 0
    connections = args.max_in_flight if is_open else args.concurrency
    client = make_client(args.client, args.url, connections)
    prober = Prober(args.url, args.prober_path, args.prober_interval) if args.prober_interval > 0 else None
    if prober is not None:
        prober.start()
    run = Run(workload, requests, args.warmup, args.duration, args.requests)
    usage_before = resource.getrusage(resource.RUSAGE_SELF)
    cpu_at_window: list[float] = []

    async def mark_window() -> None:
        await asyncio.sleep(max(0.0, run.window_start - time.monotonic()))
        usage = resource.getrusage(resource.RUSAGE_SELF)
        cpu_at_window.append(usage.ru_utime + usage.ru_stime)

    marker = asyncio.create_task(mark_window())
    try:
        if is_open:
            arrivals = poisson_arrivals(args.rate, args.warmup + args.duration, args.seed)
            await run_open(client, run, arrivals, args.max_in_flight)
        else:
            await run_closed(client, run, args.concurrency)
    finally:
        await client.close()
    marker.cancel()
    usage_after = resource.getrusage(resource.RUSAGE_SELF)
    window = max(1e-9, min(run.window_end, time.monotonic()) - run.window_start)
    cpu_start = cpu_at_window[0] if cpu_at_window else usage_before.ru_utime + usage_before.ru_stime
    cpu_used = usage_after.ru_utime + usage_after.ru_stime - cpu_start
    tally = run.tally
    result: dict[str, object] = {
        "workload": workload.name,
        "letter": workload.letter,
        "url": args.url,
        "path": args.path or workload.path,
        "client": args.client,
        "mode": "open" if is_open else "closed",
        "concurrency": 0 if is_open else args.concurrency,
        "offered_rate": args.rate if is_open else 0,
        "window_s": window,
        "requests": tally.ok,
        "requests_per_s": rate(tally.ok, window),
        "items_per_s": rate(tally.items, window),
        "tokens_per_s": rate(tally.tokens, window),
        "latency_ms": summarize_latencies(tally.latencies),
        "statuses": count_by(tally.statuses.elements()),
        "errors": {k: v for k, v in count_by(tally.statuses.elements()).items() if k != "200"},
        "server_share": shares(dict(tally.servers)),
        "generator": {
            "cpu_s": cpu_used,
            # Near 1.0 means the generator's one core was the limit, not the server.
            "cpu_share": cpu_used / window,
            "dispatch_lag_ms": summarize_latencies(tally.dispatch_lags) if is_open else None,
            "loop": args.loop,
        },
    }
    if prober is not None:
        result["prober"] = prober.finish((run.window_start, run.window_end))
    result["warnings"] = run_warnings(tally.ok, cpu_used / window)
    return result


def run_warnings(replies: int, generator_cpu_share: float) -> list[str]:
    warnings = []
    if replies < FEW_REPLIES:
        warnings.append(f"few replies ({replies}): lengthen --duration")
    if generator_cpu_share >= BUSY_GENERATOR:
        warnings.append(f"generator busy ({generator_cpu_share:.2f} of a core)")
    return warnings


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else "")
    parser.add_argument("--url", default="", help="Server base URL (loopback only).")
    parser.add_argument(
        "--target", choices=["url", "trivial"], default="url", help="trivial: start bench.trivial_server and use it."
    )
    parser.add_argument("--workload", default="a", help="a|b|c|d, or short|batch16|image|long|version|trivial.")
    parser.add_argument("--path", default="", help="Override the workload's path (/embeddings for Infinity).")
    parser.add_argument("--model-name", default="", help="Send this `model` field (Infinity wants one).")
    parser.add_argument("--encoding-format", choices=["float", "base64"], default="float")
    parser.add_argument("--client", choices=CLIENT_KINDS, default="raw")
    parser.add_argument("--loop", choices=["uvloop", "asyncio"], default="uvloop")
    parser.add_argument("--concurrency", type=int, default=1, help="Closed loop: clients sending back to back.")
    parser.add_argument("--rate", type=float, default=0.0, help="Open loop: Poisson arrivals per second (>0).")
    parser.add_argument("--max-in-flight", type=int, default=1024, help="Open loop: most requests at once.")
    parser.add_argument("--duration", type=float, default=10.0, help="Seconds measured, after the warm-up.")
    parser.add_argument("--warmup", type=float, default=1.0, help="Seconds of load before measuring.")
    parser.add_argument("--requests", type=int, default=0, help="Stop after this many successes (0: time only).")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--prober-interval", type=float, default=0.01, help="Seconds between /health probes; 0: off.")
    parser.add_argument("--prober-path", default="/health")
    parser.add_argument("--reply-dim", type=int, default=384, help="--target trivial: vector length it answers.")
    parser.add_argument("--out", default="", help="Write the JSON here as well as to stdout.")
    return parser


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    if args.concurrency < 1 or args.duration <= 0 or args.warmup < 0 or args.rate < 0:
        raise SystemExit("--concurrency must be >= 1, --duration > 0, --warmup >= 0, --rate >= 0.")
    workload = build_workload(args.workload, seed=args.seed, model_name=args.model_name,
                              encoding_format=args.encoding_format)  # fmt: skip
    trivial = None
    if args.target == "trivial":
        from bench.harness.server_process import start_trivial_server

        # Replies as large as the real server's: reading them is part of the generator's cost.
        trivial = start_trivial_server(reply_items=workload.items_per_request, reply_dim=args.reply_dim)
        args.url = trivial.url
    try:
        if not args.url:
            raise SystemExit("give --url, or --target trivial")
        check_loopback(args.url)
        if args.loop == "uvloop":
            import uvloop

            result = uvloop.run(generate(args, workload))
        else:
            result = asyncio.run(generate(args, workload))
    finally:
        if trivial is not None:
            trivial.stop()
    text = json.dumps(result, allow_nan=True)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
