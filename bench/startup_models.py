"""Start-up of one `launch` serving one model against one serving three (issue 30): `launch` started to its ready
line, and each API server's memory once ready (tokenizers are per model; torch stays out of API servers).

    python -m bench.startup_models --runs 3

The one-model server serves the bundled MiniLM; the three-model one adds a MiniLM-sized XLM-R reranker and a tiny
CLIP (bench/harness/models.py, built once into bench/.models), each model with its own engine. The two alternate, so
that a load change on a shared machine falls on both; every run starts cold processes (the page cache is warm after the
first). Both run with --dtype float32 (no bf16 probe) and the same --api-server-count.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
from typing import Any, cast

from bench.harness.models import model_folder
from bench.harness.server_process import poolserve_memory, start_poolserve

THREE_MODELS = (("minilm", "bundled"), ("rerank", "xlmr384_reranker"), ("clip", "clip"))


def declared(models: int) -> list[str]:
    """The --model flags of the first `models` of THREE_MODELS (one: the bundled model as a one-model server)."""
    if models == 1:
        return []
    return [flag for name, kind in THREE_MODELS[:models] for flag in ("--model", f"{name}={model_folder(kind)}")]


def start_once(models: int, api_servers: int) -> dict[str, Any]:
    server = start_poolserve(
        [*declared(models), "--api-server-count", str(api_servers), "--dtype", "float32", "--device", "cpu"]
    )
    try:
        memory = poolserve_memory(server.pid)
        api_rss = [cast(float, row["rss_mb"]) for row in memory if row["role"] == "apiserver" and "rss_mb" in row]
        engine_rss = [cast(float, row["rss_mb"]) for row in memory if row["role"] == "engine" and "rss_mb" in row]
        return {
            "models": models,
            "ready_after_s": round(server.ready_after, 2),
            "reported_s": server.ready_reported,
            "api_server_rss_mb": round(statistics.mean(api_rss), 1),
            "engine_rss_mb": [round(rss, 1) for rss in engine_rss],
        }
    finally:
        server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3, help="Starts of each server, alternated.")
    parser.add_argument("--api-server-count", type=int, default=2)
    args = parser.parse_args()
    for _, kind in THREE_MODELS:
        model_folder(kind)  # built before any timing
    runs = []
    for _ in range(args.runs):
        for models in (1, 3):
            run = start_once(models, args.api_server_count)
            print(json.dumps(run), flush=True)
            runs.append(run)
    print(f"load average at the end: {os.getloadavg()[0]:.1f}")
    for models in (1, 3):
        mine = [run for run in runs if run["models"] == models]
        print(
            f"{models} model(s): ready after {statistics.median(r['ready_after_s'] for r in mine):.2f} s median "
            f"({', '.join(str(r['ready_after_s']) for r in mine)}); API server RSS "
            f"{statistics.median(r['api_server_rss_mb'] for r in mine):.1f} MB median"
        )


if __name__ == "__main__":
    main()
