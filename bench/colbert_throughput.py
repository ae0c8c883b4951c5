"""A ColBERT served against its reference run one text at a time: documents per second.

    python -m bench.colbert_throughput --rounds 3 --seconds 5 --clients 16 --torch-threads 1

The model is a small ColBERT: the bundled MiniLM (6 layers, 384 wide) as the encoder, a random
bias-free projection to 128, documents cut at 180 tokens without punctuation, normalized vectors, queries
expanded to 32, saved by sentence-transformers' MultiVectorEncoder (cached in bench/.models). The baseline is
what a user who skips serving and embeds as texts arrive gets: `MultiVectorEncoder.encode_document([text])`,
one text a call (its own padding of one, no batching), in this process. The served figure is `launch --model
<it> --api-server-count 1 --device cpu --dtype float32` answering `POST /pooling {"input": [text],
"input_type": "document"}` (one document a request, as they arrive) to `--clients` concurrent clients. Both
walk the corpus of workloads (a) and (b), with the same torch threads (`--torch-threads`; 0: torch's default),
in alternating rounds (reference, served, reference, ...) with the server up throughout, so that a shared
machine's load falls on both alike. Prints one JSON object: each round, and the medians.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import string
import time
from pathlib import Path
from typing import Any

import httpx

from bench.harness.models import DEFAULT_CACHE, bundled_model_folder
from bench.harness.server_process import start_poolserve
from bench.harness.workloads import corpus_sentences

# Bumped when the builder changes, so a stale cached folder is rebuilt rather than reused.
BUILD_VERSION = "1"


def colbert_folder(cache: Path = DEFAULT_CACHE) -> Path:
    folder = cache / f"colbert-minilm-v{BUILD_VERSION}"
    if (folder / ".complete").is_file():
        return folder
    import torch
    from sentence_transformers import MultiVectorEncoder
    from sentence_transformers.base.modules import Dense, Normalize, Transformer
    from sentence_transformers.multi_vector_encoder.modules import MultiVectorMask

    torch.manual_seed(0)
    encoder = Transformer(
        str(bundled_model_folder()),
        query_expansion={"strategy": "fixed", "attend": False, "length": 32},
        document_length=180,
    )
    projection = Dense(
        384, 128, bias=False, activation_function=torch.nn.Identity(), module_input_name="token_embeddings"
    )
    modules = [
        encoder,
        projection,
        MultiVectorMask(skiplist_words=list(string.punctuation)),
        Normalize(module_input_name="token_embeddings"),
    ]
    model = MultiVectorEncoder(modules=modules, prompts={"query": "[Q] ", "document": "[D] "}, device="cpu")
    model.save(str(folder))
    (folder / ".complete").write_text("built by bench/colbert_throughput.py\n")
    return folder


def reference_one_at_a_time(model: Any, texts: list[str], seconds: float) -> dict[str, float]:
    done = 0
    start = time.perf_counter()
    while (elapsed := time.perf_counter() - start) < seconds:
        model.encode_document([texts[done % len(texts)]], convert_to_numpy=True)
        done += 1
    return {"documents_per_s": done / elapsed, "documents": done}


async def served(url: str, texts: list[str], seconds: float, clients: int) -> dict[str, float]:
    latencies: list[float] = []
    errors = 0
    deadline = time.perf_counter() + seconds
    counter = iter(range(10**9))

    async def client(session: httpx.AsyncClient) -> None:
        nonlocal errors
        while time.perf_counter() < deadline:
            text = texts[next(counter) % len(texts)]
            sent = time.perf_counter()
            answer = await session.post(
                "/pooling", json={"input": [text], "input_type": "document", "truncate_prompt_tokens": -1}
            )
            if answer.status_code != 200:
                errors += 1
            latencies.append(time.perf_counter() - sent)

    limits = httpx.Limits(max_connections=clients)
    async with httpx.AsyncClient(base_url=url, timeout=60, limits=limits) as session:
        start = time.perf_counter()
        await asyncio.gather(*(client(session) for _ in range(clients)))
        elapsed = time.perf_counter() - start
    latencies.sort()
    return {
        "documents_per_s": len(latencies) / elapsed,
        "documents": len(latencies),
        "p50_ms": 1000 * latencies[len(latencies) // 2],
        "p99_ms": 1000 * latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))],
        "errors": errors,
    }


def warm_up(url: str, texts: list[str]) -> None:
    with httpx.Client(base_url=url, timeout=60) as session:
        for text in texts[:8]:
            session.post("/pooling", json={"input": [text], "input_type": "document"}).raise_for_status()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--torch-threads", type=int, default=0)
    parser.add_argument("--out")
    args = parser.parse_args(argv)
    folder = colbert_folder()
    texts = corpus_sentences(args.seed)
    threads: list[str] = []
    if args.torch_threads:
        import torch

        torch.set_num_threads(args.torch_threads)
        threads = ["--torch-threads", str(args.torch_threads)]
    from sentence_transformers import MultiVectorEncoder

    model = MultiVectorEncoder(str(folder), device="cpu")
    model.encode_document(texts[:4])  # warm up
    flags = ["--model", str(folder), "--api-server-count", "1", "--device", "cpu", "--dtype", "float32", *threads]
    server = start_poolserve(flags)
    rounds = []
    try:
        warm_up(server.url, texts)
        for _ in range(args.rounds):
            baseline = reference_one_at_a_time(model, texts, args.seconds)
            serving = asyncio.run(served(server.url, texts, args.seconds, args.clients))
            rounds.append({"reference_one_at_a_time": baseline, "served": serving})
    finally:
        server.stop()
    reference = statistics.median(r["reference_one_at_a_time"]["documents_per_s"] for r in rounds)
    serving_median = statistics.median(r["served"]["documents_per_s"] for r in rounds)
    result = {
        "model": str(folder),
        "clients": args.clients,
        "torch_threads": args.torch_threads or "default",
        "rounds": rounds,
        "median_reference_documents_per_s": reference,
        "median_served_documents_per_s": serving_median,
        "served_over_reference": serving_median / reference,
    }
    text = json.dumps(result, indent=2)
    if args.out:
        Path(args.out).write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
