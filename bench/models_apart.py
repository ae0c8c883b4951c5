"""An embedder and a reranker in one server against each in a server of its own, under a mixed load (issue 30).

    python -m bench.models_apart --rounds 2 --seconds 20

"together": one `launch` serving the bundled MiniLM (`minilm`) and a MiniLM-sized XLM-R reranker (`rerank`,
bench/harness/models.py's xlmr384_reranker), 2 API servers; "apart": two `launch`es, one model and 1 API server
each. Both
shapes have the same processes: 2 API servers, one engine per model with --torch-threads each. Closed-loop clients
embed 4 sentences on minilm and rerank 8 documents on rerank at once, for `--seconds`; each model's throughput and
latency are measured in the same run, the two shapes alternating so that a change of the host's load falls on both.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from contextlib import ExitStack
from typing import Any

from bench.harness.models import model_folder
from bench.harness.server_process import PoolserveProcess, start_poolserve
from bench.harness.stats import summarize_latencies
from bench.harness.steady_load import SteadyLoad

EMBED: dict[str, object] = {
    "input": [
        "an embedder and a reranker",
        "in one server or in two",
        "each request embeds four sentences",
        "while other clients rerank documents",
    ],
    "model": "minilm",
}
RERANK: dict[str, object] = {
    "query": "which server shape serves two models best?",
    "documents": [f"document {i}: one server for both models, or one server each, on the same cores" for i in range(8)],
    "model": "rerank",
}


def start(models: list[tuple[str, str]], api_servers: int, torch_threads: int, extra: list[str]) -> PoolserveProcess:
    flags = [flag for name, path in models for flag in ("--model", f"{name}={path}")]
    shared = ["--api-server-count", str(api_servers), "--torch-threads", str(torch_threads)]
    return start_poolserve([*flags, *shared, "--device", "cpu", "--dtype", "float32", *extra])


def measure(embed_url: str, rerank_url: str, clients: int, seconds: float) -> dict[str, Any]:
    """Both loads at once for `seconds` after a warm-up: each model's requests/s, latencies and failures."""
    with (
        SteadyLoad(embed_url, clients=clients, body=EMBED) as embeds,
        SteadyLoad(rerank_url, clients=clients, body=RERANK, path="/v1/rerank") as reranks,
    ):
        embeds.wait_for(clients * 3, timeout=120)
        reranks.wait_for(clients * 3, timeout=120)
        marks = (len(embeds.latencies), len(reranks.latencies))
        started = time.perf_counter()
        time.sleep(seconds)
        spent = time.perf_counter() - started
        windows = (embeds.latencies[marks[0] :], reranks.latencies[marks[1] :])
    result: dict[str, Any] = {}
    for name, load, latencies in (("minilm", embeds, windows[0]), ("rerank", reranks, windows[1])):
        summary = summarize_latencies(latencies)
        failed = len(load.failures) + sum(count for status, count in load.statuses.items() if status != 200)
        result[name] = {"per_s": len(latencies) / spent, "p50": summary["p50"], "p99": summary["p99"], "failed": failed}
    return result


def run_shape(shape: str, clients: int, seconds: float, torch_threads: int, extra: list[str]) -> dict[str, Any]:
    models = [("minilm", ""), ("rerank", str(model_folder("xlmr384_reranker")))]
    load_before = os.getloadavg()[0]
    with ExitStack() as stack:
        if shape == "together":
            server = start(models, 2, torch_threads, extra)
            stack.callback(server.stop)
            urls = (server.url, server.url)
        else:
            servers = [start([model], 1, torch_threads, extra) for model in models]
            for server in servers:
                stack.callback(server.stop)
            urls = (servers[0].url, servers[1].url)
        figures = measure(*urls, clients, seconds)
    return {"shape": shape, "load_1min": round(load_before, 1), "server_args": extra, **figures}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2, help="Runs of each shape, alternated.")
    parser.add_argument("--seconds", type=float, default=20.0, help="Measured seconds of each run.")
    parser.add_argument("--clients", type=int, default=4, help="Closed-loop clients on each model.")
    parser.add_argument("--torch-threads", type=int, default=1, help="Each engine's.")
    parser.add_argument("--server-args", default="", help="More `launch` flags, every server's (one string).")
    parser.add_argument("--shapes", default="together,apart", help="Which shapes, in each round's order.")
    args = parser.parse_args()
    model_folder("xlmr384_reranker")  # built before any timing
    runs = []
    for number in range(args.rounds):
        shapes = args.shapes.split(",")
        for shape in shapes if number % 2 == 0 else reversed(shapes):
            run = run_shape(shape, args.clients, args.seconds, args.torch_threads, args.server_args.split())
            print(json.dumps(run), flush=True)
            runs.append(run)
    print(f"load average (1 min) at the end: {os.getloadavg()[0]:.1f}")
    for run in runs:
        print(
            f"{run['shape']:>8} (load {run['load_1min']}): "
            + "; ".join(
                f"{name} {run[name]['per_s']:.1f}/s p50 {run[name]['p50']:.0f} ms p99 {run[name]['p99']:.0f} ms"
                f" failed {run[name]['failed']}"
                for name in ("minilm", "rerank")
            )
        )


if __name__ == "__main__":
    main()
