"""A reranker served against its reference run pair by pair: query/document pairs scored per second.

The baseline is what a user without a server runs: sentence-transformers' `CrossEncoder.predict` one pair at a
time (padded, unbatched), and, for scale, the same over all pairs in batches of 32 (the offline ceiling). The
served figure is `launch` (float32, one API server) answering `/v1/rerank` requests of one query and
`--docs` documents from `--clients` closed-loop clients. All three in one run, on one corpus, alternated
over `--rounds` (this machine is shared and noisy: compare within a round).

    python -m bench.rerank_throughput --model llm_reranker --rounds 2
"""

from __future__ import annotations

import argparse
import json
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from bench.harness.corpus import make_sentences
from bench.harness.models import model_folder
from bench.harness.server_process import start_poolserve


def pairs_per_second(run: Callable[[], int], min_seconds: float) -> float:
    """Pairs a second of `run` (which scores some pairs and says how many), repeated for at least `min_seconds`."""
    done, started = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - started) < min_seconds or done == 0:
        done += run()
    return done / elapsed


def offline(folder: Path, pairs: list[tuple[str, str]], batch_size: int, seconds: float) -> float:
    from sentence_transformers import CrossEncoder

    model = CrossEncoder(str(folder), device="cpu")
    model.predict(pairs[:2], batch_size=batch_size)  # warm up

    def run() -> int:
        if batch_size == 1:
            for pair in pairs[:32]:
                model.predict([pair], batch_size=1, show_progress_bar=False)
            return 32
        model.predict(pairs, batch_size=batch_size, show_progress_bar=False)
        return len(pairs)

    return pairs_per_second(run, seconds)


def served(url: str, queries: list[str], documents: list[str], *, docs: int, clients: int, seconds: float) -> float:
    done = [0] * clients
    stop = time.perf_counter() + seconds

    def client(index: int) -> None:
        with httpx.Client(base_url=url, timeout=60) as http:
            i = index
            while time.perf_counter() < stop:
                chosen = [documents[(i * docs + j) % len(documents)] for j in range(docs)]
                body = {"query": queries[i % len(queries)], "documents": chosen, "return_documents": False}
                response = http.post("/v1/rerank", json=body)
                response.raise_for_status()
                done[index] += docs
                i += clients

    started = time.perf_counter()
    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return sum(done) / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="llm_reranker", help="a bench.harness.models kind or a folder")
    parser.add_argument("--docs", type=int, default=16, help="documents per rerank request")
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=15.0, help="per measurement")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out", type=Path, default=None, help="write the figures as JSON here")
    args = parser.parse_args()
    folder = Path(args.model) if Path(args.model).is_dir() else model_folder(args.model)
    queries = make_sentences(64, seed=11, min_words=5, max_words=12)
    documents = make_sentences(256, seed=12, min_words=20, max_words=60)
    pairs = [(queries[i % len(queries)], documents[i]) for i in range(256)]
    rounds: list[dict[str, Any]] = []
    server = start_poolserve(["--model", str(folder), "--dtype", "float32", "--api-server-count", "1"])
    try:
        for number in range(args.rounds):
            figures: dict[str, float] = {}
            order = ["served", "unbatched", "batched"]
            for name in order if number % 2 == 0 else reversed(order):
                if name == "served":
                    figures[name] = served(
                        server.url, queries, documents, docs=args.docs, clients=args.clients, seconds=args.seconds
                    )
                else:
                    figures[name] = offline(folder, pairs, 1 if name == "unbatched" else 32, args.seconds)
                print(f"round {number + 1}: {name} {figures[name]:.1f} pairs/s", flush=True)
            figures["served / unbatched"] = figures["served"] / figures["unbatched"]
            figures["served / batched"] = figures["served"] / figures["batched"]
            print(f"round {number + 1}: {json.dumps({k: round(v, 2) for k, v in figures.items()})}", flush=True)
            rounds.append(figures)
    finally:
        server.stop()
    if args.out:
        settings = {key: str(value) for key, value in vars(args).items()}
        args.out.write_text(json.dumps({"args": settings, "rounds": rounds}, indent=2))


if __name__ == "__main__":
    main()
