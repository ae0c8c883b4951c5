"""A SPLADE model served against its unbatched baseline: sentences/s of /embed_sparse under concurrent one-sentence
requests, and of `SparseEncoder.encode` called one sentence at a time, on the same corpus and device.

    python -m bench.splade_throughput --clients 16 --seconds 10 --rounds 2 --torch-threads 1

The model is bench/harness/models.py's `splade` (a 2-layer BERT masked LM over the 30522-entry BERT vocabulary,
SpladePooling max; random weights, so about 80% of a vector's entries are non-zero where a trained SPLADE
keeps a few hundred: the answer here is far larger than a real model's). The baseline is what a user who
skips serving gets per request: the library's tokenizer, forward pass, pooling and sparse tensor for one
sentence. The two alternate, `--rounds` times each, with the server up throughout (idle while the baseline
runs): on a shared machine a neighbour's load then falls on both. `--torch-threads` is both sides' torch threads
(0: torch's default): on a loaded 2-core host, two OpenMP threads wait on each other and the figures swing 10x.
Prints one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from typing import Any

import httpx

from bench.harness.models import model_folder
from bench.harness.server_process import start_poolserve
from bench.harness.workloads import corpus_sentences


def baseline(model: Any, sentences: list[str], seconds: float) -> float:
    done = 0
    start = time.perf_counter()
    while (elapsed := time.perf_counter() - start) < seconds:
        model.encode(sentences[done % len(sentences)], convert_to_tensor=True).to_dense()  # the host has the row
        done += 1
    return done / elapsed


async def served(url: str, sentences: list[str], clients: int, seconds: float) -> float:
    """Sentences/s, each client sending one sentence after another."""
    done = 0
    deadline = time.perf_counter() + seconds

    async def client(offset: int, http: httpx.AsyncClient) -> None:
        nonlocal done
        i = offset
        while time.perf_counter() < deadline:
            response = await http.post("/embed_sparse", json={"inputs": sentences[i % len(sentences)]})
            response.raise_for_status()
            done += 1
            i += clients

    limits = httpx.Limits(max_connections=clients)
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=60) as http:
        await http.post("/embed_sparse", json={"inputs": sentences[:8]})  # warm up
        start = time.perf_counter()
        await asyncio.gather(*(client(k, http) for k in range(clients)))
        elapsed = time.perf_counter() - start
    return done / elapsed


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--api-servers", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--torch-threads", type=int, default=0)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    import torch
    from sentence_transformers import SparseEncoder

    if args.torch_threads:
        torch.set_num_threads(args.torch_threads)
    folder = str(model_folder("splade"))
    sentences = corpus_sentences(args.seed)
    model = SparseEncoder(folder, device=args.device)
    model.encode(sentences[:1])  # warm up
    flags = ["--model", folder, "--device", args.device, "--dtype", args.dtype]
    if args.torch_threads:
        flags += ["--torch-threads", str(args.torch_threads)]
    server = start_poolserve([*flags, "--api-server-count", str(args.api_servers)])
    baselines: list[float] = []
    rates: list[float] = []
    try:
        for _ in range(args.rounds):
            baselines.append(round(baseline(model, sentences, args.seconds), 1))
            rates.append(round(asyncio.run(served(server.url, sentences, args.clients, args.seconds)), 1))
    finally:
        server.stop()
    result = {
        "model": "bench.harness.models splade",
        "device": args.device,
        "dtype": args.dtype,
        "clients": args.clients,
        "torch_threads": args.torch_threads,
        "seconds": args.seconds,
        "baseline_sentences_per_s": baselines,
        "served_sentences_per_s": rates,
        "served_over_baseline": round(sum(rates) / sum(baselines), 2),
    }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
