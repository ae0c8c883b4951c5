"""The engine's cache (--cache-bytes) on and off: a repeated corpus, and one that never repeats.

    python -m bench.cache_repeat [--sentences 400] [--repeats 10] [--clients 8] [--per-request 4]

Each run starts a fresh server (`--api-server-count 2`), then `--clients` keep-alive clients send
requests of `--per-request` sentences until the list is done. "repeated": every sentence of the
corpus `--repeats` times, in a shuffled order (a re-index of unchanged chunks, a popular query);
"distinct": as many sentences, none twice (what the cache costs when it never hits). Printed:
sentences per second of each workload with the cache off and on, and the hits the server counted.
docs/benchmarks.md, "Embedding cache", holds the figures and the command.
"""

from __future__ import annotations

import argparse
import json
import random
import threading
import time

import httpx

from bench.harness.corpus import make_sentence
from bench.harness.server_process import start_poolserve


def run(url: str, requests: list[list[str]], clients: int) -> float:
    """Sentences per second sending `requests` over `clients` keep-alive connections."""
    queue = list(reversed(requests))
    lock = threading.Lock()

    def client() -> None:
        with httpx.Client(base_url=url, timeout=120) as http:
            while True:
                with lock:
                    if not queue:
                        return
                    body = queue.pop()
                http.post("/v1/embeddings", json={"input": body}).raise_for_status()

    started = time.perf_counter()
    threads = [threading.Thread(target=client) for _ in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return sum(map(len, requests)) / (time.perf_counter() - started)


def hits(url: str) -> float:
    text = httpx.get(url + "/metrics").text
    return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith("poolserve_cache_hits_total"))


def measure_cache(
    *, sentences: int, repeats: int, clients: int, per_request: int, cache_bytes: int, server_args: list[str]
) -> dict[str, dict[str, float]]:
    """Sentences/s of the repeated and the distinct corpus with the cache off and on (a fresh server each)."""
    rng = random.Random(0)
    corpus = [make_sentence(rng) for _ in range(sentences)]
    repeated = corpus * repeats
    rng.shuffle(repeated)
    distinct = [make_sentence(rng) + f" ({i})" for i in range(len(repeated))]
    report: dict[str, dict[str, float]] = {}
    for size in (0, cache_bytes):
        server = start_poolserve(["--api-server-count", "2", "--cache-bytes", str(size), *server_args])
        try:
            run(server.url, [corpus[:per_request]] * 20, clients)  # warm up
            report[f"cache {size}"] = {
                "repeated sentences/s": round(run(server.url, batched(repeated, per_request), clients), 1),
                "distinct sentences/s": round(run(server.url, batched(distinct, per_request), clients), 1),
                "hits": hits(server.url),
            }
        finally:
            server.stop()
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sentences", type=int, default=400)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--per-request", type=int, default=4)
    parser.add_argument("--cache-bytes", type=int, default=64 * 1024 * 1024)
    args = parser.parse_args()
    report = measure_cache(
        sentences=args.sentences, repeats=args.repeats, clients=args.clients, per_request=args.per_request,
        cache_bytes=args.cache_bytes, server_args=[],
    )  # fmt: skip
    print(json.dumps(report, indent=2))


def batched(items: list[str], size: int) -> list[list[str]]:
    return [items[i : i + size] for i in range(0, len(items), size)]


if __name__ == "__main__":
    main()
