"""bfloat16 against float32 on this CPU: speed, and how far the vectors and a retrieval ranking move.

    python -m bench.cpu_precision [--sentences 1024] [--queries 100] [--batch 32] [--rounds 2]

Loads the bundled model twice with the engine's own loader (`--dtype float32` and
`--dtype bfloat16`), times runner.run_texts over the bench corpus in batches of `--batch`
(alternating the two precisions for `--rounds` rounds, so that a noisy neighbour hits both), and
compares their vectors: the lowest cosine between a sentence's two vectors, and the mean overlap
of each query's top-10 documents (queries and documents are separate generated sentences). It
also says whether this processor has native bf16, which is what `--dtype auto` decides on
(engine_core/cpu_precision.py). docs/benchmarks.md, "CPU engine", holds the figures.
"""

from __future__ import annotations

import argparse
import json
import random
import time

import numpy as np
import numpy.typing as npt

from bench.harness.corpus import make_sentence
from bench.harness.machine import cpu_model


def top_k(queries: npt.NDArray[np.float64], documents: npt.NDArray[np.float64], k: int) -> list[set[int]]:
    order = np.argsort(-(queries @ documents.T), axis=1, kind="stable")[:, :k]
    return [set(map(int, row)) for row in order]


def unit(rows: npt.NDArray[np.float32]) -> npt.NDArray[np.float64]:
    wide = rows.astype(np.float64)
    return wide / np.linalg.norm(wide, axis=1, keepdims=True)  # type: ignore[no-any-return]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sentences", type=int, default=1024)
    parser.add_argument("--queries", type=int, default=100)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()

    from tokenizers import Tokenizer

    from engine_core.cpu_precision import has_native_bf16
    from engine_core.load_model import load_model
    from poolserve.config import Config

    models = {name: load_model(Config(device="cpu", dtype=name, runtime="torch")) for name in ("float32", "bfloat16")}
    backend = Tokenizer.from_str(models["float32"].card.tokenizer_json)
    rng = random.Random(0)
    documents = [make_sentence(rng) for _ in range(args.sentences)]
    queries = [" ".join(make_sentence(rng).split()[:8]) for _ in range(args.queries)]

    def ids(texts: list[str]) -> list[npt.NDArray[np.int32]]:
        return [np.asarray(backend.encode(text).ids, dtype=np.int32) for text in texts]

    doc_rows, query_rows = ids(documents), ids(queries)
    vectors: dict[str, dict[str, npt.NDArray[np.float64]]] = {}
    rates: dict[str, list[float]] = {name: [] for name in models}
    for _ in range(args.rounds):
        for name, loaded in models.items():
            started = time.perf_counter()
            out = [
                loaded.runner.run_texts(doc_rows[i : i + args.batch], None) for i in range(0, len(doc_rows), args.batch)
            ]
            rates[name].append(len(doc_rows) / (time.perf_counter() - started))
            vectors[name] = {
                "documents": unit(np.concatenate(out)),
                "queries": unit(loaded.runner.run_texts(query_rows, None)),
            }
    fp32, bf16 = vectors["float32"], vectors["bfloat16"]
    cosines = np.sum(fp32["documents"] * bf16["documents"], axis=1)
    overlaps = [len(a & b) / 10 for a, b in zip(top_k(fp32["queries"], fp32["documents"], 10),
                                               top_k(bf16["queries"], bf16["documents"], 10), strict=True)]  # fmt: skip
    report = {
        "cpu": cpu_model(),
        "native_bf16": has_native_bf16(),
        "sentences_per_s": {name: [round(r, 1) for r in values] for name, values in rates.items()},
        "bf16_over_fp32": round(max(rates["bfloat16"]) / max(rates["float32"]), 3),
        "min_cosine": round(float(cosines.min()), 5),
        "mean_cosine": round(float(cosines.mean()), 5),
        "top10_overlap_mean": round(float(np.mean(overlaps)), 4),
        "top10_overlap_min": round(float(np.min(overlaps)), 2),
    }
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
