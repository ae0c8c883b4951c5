"""How keep-alive connections and their requests spread over the API servers.

`python -m bench.spread --api-server-count 2 --runs 10` starts poolserve, then in each run opens
`--connections` keep-alive connections at once (each its own TCP connection, as a pool of
clients would), sends `--requests` embedding requests on each one after the other, and counts
which API server (`x-poolserve-server`) answered each connection and each request. It prints
each run's shares and the worst deviation from a fair share; `--json` writes them. The
end-to-end tests use `measure_spread` on a server they started.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

import msgspec

from bench.harness.clients import RawClient, RawConnection, prepare_request
from bench.harness.polling import poll_until
from bench.harness.scrape import scrape, total
from bench.harness.server_process import start_poolserve

DEFAULT_BODY = {"input": "a short query about keep-alive connections"}


@dataclass(slots=True)
class SpreadRun:
    """One run: per server, how many connections it took and how many requests it answered."""

    connections: dict[str, int] = field(default_factory=dict)
    requests: dict[str, int] = field(default_factory=dict)
    failures: int = 0
    seconds: float = 0.0
    # Connections a paused server took because none was taken off the queue for HANDOFF_S
    # (apiserver/connection/fair_accept.py): the gate choosing latency over balance.
    takeovers: int = 0

    def shares(self, servers: int, of: str) -> list[float]:
        counts = self.connections if of == "connections" else self.requests
        total = sum(counts.values()) or 1
        return sorted((counts.get(str(index), 0) / total for index in range(servers)), reverse=True)

    def worst_deviation(self, servers: int) -> float:
        """The largest |share - fair| / fair over servers, connections and requests both."""
        fair = 1 / servers
        return max(abs(share - fair) / fair for of in ("connections", "requests") for share in self.shares(servers, of))


async def open_connections(url: str, count: int) -> list[RawConnection]:
    client = RawClient(url)
    return list(await asyncio.gather(*(client.connect() for _ in range(count))))


async def run_once(url: str, connections: int, requests: int, body: dict[str, object] | None = None) -> SpreadRun:
    """Open `connections` connections together, then send `requests` requests on each, all at once."""
    host = url.split("://", 1)[1].split("/", 1)[0]
    request = prepare_request("POST", "/v1/embeddings", msgspec.json.encode(body or DEFAULT_BODY), host)
    run = SpreadRun()
    started = time.perf_counter()
    opened = await open_connections(url, connections)
    by_connection: list[Counter[str]] = [Counter() for _ in opened]

    async def drive(index: int, connection: RawConnection) -> None:
        for _ in range(requests):
            if not connection.is_open:
                run.failures += 1
                continue
            try:
                reply = await connection.send(request)
            except ConnectionError:
                run.failures += 1
                continue
            if reply.status != 200:
                run.failures += 1
            by_connection[index][reply.server] += 1

    try:
        await asyncio.gather(*(drive(index, connection) for index, connection in enumerate(opened)))
    finally:
        for connection in opened:
            connection.close()
    run.seconds = time.perf_counter() - started
    connection_counts: Counter[str] = Counter()
    request_counts: Counter[str] = Counter()
    for served in by_connection:
        if served:
            connection_counts[served.most_common(1)[0][0]] += 1
            request_counts.update(served)
    run.connections = dict(connection_counts)
    run.requests = dict(request_counts)
    return run


def open_connections_reported(url: str) -> int:
    """The server's own count of open connections, all API servers together (this scrape's included)."""
    return round(total(scrape(url), "poolserve_open_connections"))


def takeovers_reported(url: str) -> int:
    """Connections taken by a paused server after HANDOFF_S, all API servers together, since the server started."""
    return round(total(scrape(url), "poolserve_accept_takeovers_total"))


def wait_until_idle(url: str, timeout: float = 10.0) -> None:
    """Until the servers have seen the previous run's connections close, so each run starts from zero."""
    poll_until(lambda: open_connections_reported(url) <= 1, timeout)


def measure_spread(url: str, *, connections: int = 32, requests: int = 10, runs: int = 10) -> list[SpreadRun]:
    """`runs` runs one after the other, each from a server that holds no connection."""
    results = []
    for _ in range(runs):
        wait_until_idle(url)
        takeovers = takeovers_reported(url)
        run = asyncio.run(run_once(url, connections, requests))
        run.takeovers = takeovers_reported(url) - takeovers
        results.append(run)
    return results


@dataclass(slots=True)
class UnequalRun:
    """The hard case: a proxy's few long-lived connections carrying unequal load. Inputs and requests
    served per server (inputs are the frontend work), and how often a retired connection reconnected."""

    inputs: dict[str, int] = field(default_factory=dict)
    requests: dict[str, int] = field(default_factory=dict)
    reconnects: int = 0
    failures: int = 0
    seconds: float = 0.0

    def input_shares(self, servers: int) -> list[float]:
        total = sum(self.inputs.values()) or 1
        return sorted((self.inputs.get(str(index), 0) / total for index in range(servers)), reverse=True)


async def run_unequal(url: str, seconds: float, hot: int = 2, cold: int = 2, hot_inputs: int = 16) -> UnequalRun:
    """`hot` connections send `hot_inputs`-input requests back to back; `cold` ones send one input
    every 100 ms (a proxy reuses its most recent connection first, so its pool has a few hot and
    some mostly idle connections). A connection the server retires is reopened at once, through
    fair accept again."""
    host = url.split("://", 1)[1].split("/", 1)[0]
    texts = [f"document {index} about load that is not spread evenly" for index in range(hot_inputs)]
    heavy = prepare_request("POST", "/v1/embeddings", msgspec.json.encode({"input": texts}), host)
    light = prepare_request("POST", "/v1/embeddings", msgspec.json.encode({"input": texts[0]}), host)
    result = UnequalRun()
    inputs: Counter[str] = Counter()
    requests: Counter[str] = Counter()
    client = RawClient(url)
    deadline = time.monotonic() + seconds

    async def drive(request_bytes: object, weight: int, pause: float) -> None:
        connection = await client.connect()
        while time.monotonic() < deadline:
            if not connection.is_open:
                result.reconnects += 1
                connection = await client.connect()
            try:
                reply = await connection.send(request_bytes)  # type: ignore[arg-type]
            except ConnectionError:
                result.failures += 1
                continue
            if reply.status != 200:
                result.failures += 1
                continue
            inputs[reply.server] += weight
            requests[reply.server] += 1
            if pause:
                await asyncio.sleep(pause)
        connection.close()

    started = time.perf_counter()
    await asyncio.gather(
        *(drive(heavy, hot_inputs, 0.0) for _ in range(hot)), *(drive(light, 1, 0.1) for _ in range(cold))
    )
    result.seconds = time.perf_counter() - started
    result.inputs = dict(inputs)
    result.requests = dict(requests)
    return result


def describe(run: SpreadRun, servers: int) -> str:
    connections = " / ".join(f"{share:.2f}" for share in run.shares(servers, "connections"))
    requests = " / ".join(f"{share:.2f}" for share in run.shares(servers, "requests"))
    return (
        f"connections {connections}   requests {requests}   worst {run.worst_deviation(servers):+.0%}"
        f"   takeovers {run.takeovers}   failures {run.failures}   {run.seconds:.2f}s"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.spread", description=__doc__.split("\n\n")[0])
    parser.add_argument("--api-server-count", type=int, default=2)
    parser.add_argument("--connections", type=int, default=32)
    parser.add_argument("--requests", type=int, default=10)
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument(
        "--scenario",
        choices=["burst", "unequal"],
        default="burst",
        help="burst: connections opened at once, shares counted per run; unequal: 2 hot and 2 cold long-lived "
        "connections for --seconds, inputs served per server counted (the hard case for the gate).",
    )
    parser.add_argument("--seconds", type=float, default=20.0, help="unequal: how long each run lasts.")
    parser.add_argument("--url", default="", help="Measure a server already running here instead of starting one.")
    parser.add_argument("--json", default="", help="Write the runs to this file.")
    parser.add_argument("launch_args", nargs="*", help="More `launch` flags, after `--`.")
    args = parser.parse_args(argv)
    server = None
    url = args.url
    if not url:
        server = start_poolserve(["--api-server-count", str(args.api_server_count), *args.launch_args])
        url = server.url
    try:
        if args.scenario == "unequal":
            return report_unequal(url, args)
        runs = measure_spread(url, connections=args.connections, requests=args.requests, runs=args.runs)
    finally:
        if server is not None:
            server.stop()
    for index, run in enumerate(runs):
        print(f"run {index + 1:2d}: {describe(run, args.api_server_count)}")
    worst = max(run.worst_deviation(args.api_server_count) for run in runs)
    print(f"worst deviation from a fair share over {len(runs)} runs: {worst:.0%}")
    write_json(args, runs)
    return 0


def write_json(args: argparse.Namespace, runs: Sequence[SpreadRun | UnequalRun]) -> None:
    if args.json:
        with open(args.json, "w") as out:
            json.dump({"args": vars(args), "runs": [asdict(run) for run in runs]}, out, indent=1)


def report_unequal(url: str, args: argparse.Namespace) -> int:
    runs = []
    for index in range(args.runs):
        wait_until_idle(url)
        run = asyncio.run(run_unequal(url, args.seconds))
        runs.append(run)
        shares = " / ".join(f"{share:.2f}" for share in run.input_shares(args.api_server_count))
        print(
            f"run {index + 1:2d}: input shares {shares}   inputs/s {sum(run.inputs.values()) / run.seconds:.0f}"
            f"   reconnects {run.reconnects}   failures {run.failures}"
        )
    worst = max(run.input_shares(args.api_server_count)[0] for run in runs)
    mean_top = statistics.mean(run.input_shares(args.api_server_count)[0] for run in runs)
    print(f"largest input share: mean {mean_top:.2f}, worst {worst:.2f} over {len(runs)} runs")
    write_json(args, runs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
