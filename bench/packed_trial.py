"""Token packing against the padded forward pass on this machine: speed and agreement, batch by batch.

    python -m bench.packed_trial [--model bundled] [--sentences 512] [--batches 1,8,16,32] [--rounds 3]
        [--dtype float32]

Loads `--model` (the bundled model, or one of bench/models.py's `PACKED_KINDS`: random encoders of MiniLM's size
in each architecture packing runs, and an XLM-RoBERTa cross-encoder) with the engine's own loader and runs the
same batches of bench corpus sentences (for a cross-encoder, pairs of consecutive sentences) through its runner
padded (`--token-packing off`) and packed (engine_core/packed_encoder.py), the two alternated batch by batch for
`--rounds` rounds so that a noisy neighbour hits both. Two orders: `arrival` (batches of consecutive corpus sentences, as the
scheduler fills them from whatever is waiting) and `sorted` (the corpus sorted by length first, the
least padding a length-sorted cut can reach). Reports each batch size's seconds per sentence
(best round), the packed/padded ratio, the share of the padded pass's tokens that were padding,
and the lowest cosine between a sentence's two vectors (for a cross-encoder, the largest difference between
its two scores). docs/benchmarks.md, "CPU engine".
"""

from __future__ import annotations

import argparse
import copy
import json
import time

import numpy as np
import numpy.typing as npt

from bench.machine import cpu_model
from bench.models import model_folder
from bench.workloads import corpus_sentences


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="bundled", help="a bench.models kind: bundled or one of PACKED_KINDS")
    parser.add_argument("--sentences", type=int, default=512)
    parser.add_argument("--batches", default="1,8,16,32", help="Batch sizes, comma-separated.")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    from tokenizers import Tokenizer

    from engine_core.loader import load_model
    from engine_core.packed_encoder import packable
    from engine_core.runner import ClassifierRunner, EmbeddingRunner
    from poolserve.config import Config

    folder = str(model_folder(args.model))
    loaded = load_model(Config(model=folder, device="cpu", dtype=args.dtype, token_packing="off"))
    padded = loaded.runner
    assert isinstance(padded, EmbeddingRunner | ClassifierRunner) and packable(padded.model)
    packed = copy.copy(padded)
    packed.packed = True
    is_classifier = isinstance(padded, ClassifierRunner)
    backend = Tokenizer.from_str(loaded.card.tokenizer_json)
    sentences = corpus_sentences(args.seed)[: args.sentences + 1]
    if is_classifier:  # a query and a document: consecutive sentences
        encodings = [backend.encode(a, b) for a, b in zip(sentences, sentences[1:], strict=False)]
    else:
        encodings = [backend.encode(text) for text in sentences[: args.sentences]]
    uses_types = loaded.card.uses_token_types
    rows = [(np.asarray(e.ids, dtype=np.int32), np.asarray(e.type_ids, dtype=np.int32)) for e in encodings]
    orders = {"arrival": rows, "sorted": sorted(rows, key=lambda row: len(row[0]))}
    report: dict[str, object] = {
        "cpu": cpu_model(), "model": args.model, "architecture": type(padded.model).__name__, "dtype": args.dtype,
        "inputs": len(rows), "results": [],
    }  # fmt: skip
    results: list[dict[str, object]] = report["results"]  # type: ignore[assignment]
    for order, ordered in orders.items():
        for size in (int(s) for s in args.batches.split(",")):
            batches = [ordered[i : i + size] for i in range(0, len(ordered), size)]
            seconds = {"padded": [0.0] * args.rounds, "packed": [0.0] * args.rounds}
            vectors: dict[str, list[npt.NDArray[np.float32]]] = {"padded": [], "packed": []}
            for round_ in range(args.rounds):
                for batch in batches:
                    ids = [row for row, _ in batch]
                    types = [row_types for _, row_types in batch] if uses_types else None
                    for name, runner in (("padded", padded), ("packed", packed)):
                        started = time.perf_counter()
                        out = runner.run_texts(ids, types)
                        seconds[name][round_] += time.perf_counter() - started
                        if round_ == 0:
                            vectors[name].append(out)
            a, b = np.concatenate(vectors["padded"]), np.concatenate(vectors["packed"])
            cosine = (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)
            real = sum(len(row) for row, _ in ordered)
            computed = sum(len(batch) * max(len(row) for row, _ in batch) for batch in batches)
            best = {name: min(values) for name, values in seconds.items()}
            results.append({
                "order": order,
                "batch": size,
                "padding_share": round(1 - real / computed, 3),
                "padded_ms_per_sentence": round(1000 * best["padded"] / len(ordered), 3),
                "packed_ms_per_sentence": round(1000 * best["packed"] / len(ordered), 3),
                "packed_over_padded": round(best["packed"] / best["padded"], 3),
                "min_cosine": round(float(cosine.min()), 7),
                "max_abs_difference": float(np.abs(a - b).max()),
            })  # fmt: skip
            print(json.dumps(results[-1]), flush=True)
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
