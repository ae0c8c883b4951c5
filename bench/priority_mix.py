"""Queries during bulk indexing: one-sentence queries' latency alone, then under bulk load at priority 0 and -1.

    python -m bench.priority_mix [--bulk-clients 4] [--bulk-inputs 64] [--queries 60] [--api-servers 2]

The bulk clients (bench/harness/steady_load.py, one keep-alive connection each) send `--bulk-inputs`
sentences per request back to back, which keeps the engine saturated. A query client sends one
sentence every `--gap` seconds, alternating priority 0 and -1, so both see the same load. Printed:
query p50/p99 unloaded, under load at each priority, and the bulk throughput with every bulk
status (all must be 200: bulk work is never starved). docs/benchmarks.md, "Queries during bulk
indexing", holds the figures and the command.
"""

from __future__ import annotations

import argparse
import json
import random
import time

import httpx

from bench.harness.corpus import make_sentence
from bench.harness.server_process import start_poolserve
from bench.harness.stats import summarize_latencies
from bench.harness.steady_load import SteadyLoad

QUERY = "how do I reset my password"


def query_latencies(client: httpx.Client, count: int, gap: float, priorities: list[int]) -> dict[int, list[float]]:
    seen: dict[int, list[float]] = {p: [] for p in priorities}
    for i in range(count):
        priority = priorities[i % len(priorities)]
        started = time.perf_counter()
        response = client.post("/v1/embeddings", json={"input": QUERY, "priority": priority})
        response.raise_for_status()
        seen[priority].append(time.perf_counter() - started)
        time.sleep(gap)
    return seen


def measure_priority_mix(
    *, bulk_clients: int, bulk_inputs: int, queries: int, gap: float, api_servers: int, server_args: list[str]
) -> dict[str, object]:
    """Query latencies unloaded and under bulk load at priority 0 and -1, on a fresh server."""
    rng = random.Random(0)
    bulk: dict[str, object] = {"input": [make_sentence(rng) for _ in range(bulk_inputs)]}
    server = start_poolserve(["--api-server-count", str(api_servers), *server_args])
    try:
        with httpx.Client(base_url=server.url, timeout=120) as client:
            query_latencies(client, 10, gap, [0])  # warm up
            unloaded = query_latencies(client, queries, gap, [0])[0]
            with SteadyLoad(server.url, clients=bulk_clients, body=bulk, timeout=120) as load:
                load.wait_for(bulk_clients)
                started, before = time.perf_counter(), sum(load.statuses.values())
                loaded = query_latencies(client, 2 * queries, gap, [0, -1])
                elapsed = time.perf_counter() - started
                answered = sum(load.statuses.values()) - before
            statuses = dict(load.statuses)
    finally:
        server.stop()
    return {
        "unloaded": summarize_latencies(unloaded),
        "under bulk, priority 0": summarize_latencies(loaded[0]),
        "under bulk, priority -1": summarize_latencies(loaded[-1]),
        "bulk inputs/s": round(answered * bulk_inputs / elapsed, 1),
        "bulk statuses": {str(code): count for code, count in statuses.items()},
        "bulk failures": len(load.failures),
        "settings": {
            "bulk_clients": bulk_clients,
            "bulk_inputs": bulk_inputs,
            "queries": queries,
            "gap": gap,
            "api_servers": api_servers,
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bulk-clients", type=int, default=4)
    parser.add_argument("--bulk-inputs", type=int, default=64)
    parser.add_argument("--queries", type=int, default=60, help="queries per priority under load")
    parser.add_argument("--gap", type=float, default=0.1, help="seconds between queries")
    parser.add_argument("--api-servers", type=int, default=2)
    parser.add_argument("--server-args", default="", help="Extra `launch` flags, e.g. --torch-threads 2.")
    args = parser.parse_args()
    report = measure_priority_mix(
        bulk_clients=args.bulk_clients, bulk_inputs=args.bulk_inputs, queries=args.queries, gap=args.gap,
        api_servers=args.api_servers, server_args=args.server_args.split(),
    )  # fmt: skip
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
