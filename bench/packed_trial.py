"""Token packing against the padded forward pass on this machine: speed and agreement, batch by batch.

    python -m bench.packed_trial [--model bundled] [--sentences 512] [--batches 1,8,16,32] [--rounds 3]
        [--dtype float32] [--threads N] [--out FILE]

Loads `--model` (the bundled model, or one of bench/harness/models.py's `PACKED_KINDS`: random encoders of MiniLM's size
in each architecture packing runs, and an XLM-RoBERTa cross-encoder) with the engine's own loader and runs the
same batches of bench corpus sentences (for a cross-encoder, pairs of consecutive sentences) through its runner
padded (`--token-packing off`) and packed (engine_core/packed_encoder.py), the two alternated batch by batch for
`--rounds` rounds so that a noisy neighbour hits both (which of the two runs first alternates too). Two orders:
`arrival` (batches of consecutive corpus sentences, as the scheduler fills them from whatever is waiting) and
`sorted` (the corpus sorted by length first, the least padding a length-sorted cut can reach). Reports each batch
size's milliseconds per sentence (each batch's best round, summed: on a host shared with other tenants a burst
then spoils one sample of a batch, not a whole round), the packed/padded ratio of that wall-clock time and of the
process's CPU time (what the two cost whoever else runs: the better witness on a busy host, with `--threads 1`
especially), the share of the padded pass's tokens that were padding, and the lowest cosine between a sentence's
two vectors (for a cross-encoder, the largest difference between its two scores). docs/benchmarks.md, "CPU engine".
"""

from __future__ import annotations

import argparse
import copy
import itertools
import json
import sys
import time
from pathlib import Path

import numpy as np
import numpy.typing as npt

from bench.harness.machine import git_facts, machine_facts
from bench.harness.models import model_folder
from bench.harness.workloads import corpus_sentences

# Wall-clock time, and the CPU time of this process (all its threads): what a pass took, and what it cost.
CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--model", default="bundled", help="a bench.harness.models kind: bundled or one of PACKED_KINDS"
    )
    parser.add_argument("--sentences", type=int, default=512)
    parser.add_argument("--batches", default="1,8,16,32", help="Batch sizes, comma-separated.")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    parser.add_argument("--out", type=Path, help="also write the report (JSON) here")
    args = parser.parse_args()

    import torch
    from tokenizers import Tokenizer

    from engine_core.load_model import load_model
    from engine_core.packed_encoder import packable
    from engine_core.runner import ClassifierRunner, EmbeddingRunner
    from poolserve.config import Config

    if args.threads:
        torch.set_num_threads(args.threads)
    folder = str(model_folder(args.model))
    loaded = load_model(Config(model=folder, device="cpu", dtype=args.dtype, token_packing="off", runtime="torch"))
    padded = loaded.runner
    assert isinstance(padded, EmbeddingRunner | ClassifierRunner) and packable(padded.model)
    packed = copy.copy(padded)
    packed.packed = True
    is_classifier = isinstance(padded, ClassifierRunner)
    backend = Tokenizer.from_str(loaded.card.tokenizer_json)
    sentences = corpus_sentences(args.seed)[: args.sentences + 1]
    if is_classifier:  # a query and a document: consecutive sentences
        encodings = [backend.encode(a, b) for a, b in itertools.pairwise(sentences)]
    else:
        encodings = [backend.encode(text) for text in sentences[: args.sentences]]
    uses_types = loaded.card.uses_token_types
    rows = [(np.asarray(e.ids, dtype=np.int32), np.asarray(e.type_ids, dtype=np.int32)) for e in encodings]
    orders = {"arrival": rows, "sorted": sorted(rows, key=lambda row: len(row[0]))}
    report: dict[str, object] = {
        "machine": machine_facts(), "git": git_facts(),
        "command": ["python", "-m", "bench.packed_trial", *sys.argv[1:]], "model": args.model,
        "architecture": type(padded.model).__name__, "dtype": args.dtype, "threads": torch.get_num_threads(),
        "inputs": len(rows), "results": [],
    }  # fmt: skip
    results: list[dict[str, object]] = report["results"]  # type: ignore[assignment]
    for order, ordered in orders.items():
        for size in (int(s) for s in args.batches.split(",")):
            batches = [ordered[i : i + size] for i in range(0, len(ordered), size)]
            # [variant][clock][batch]: that batch's times, one per round
            times: dict[str, dict[str, list[list[float]]]] = {
                name: {clock: [[] for _ in batches] for clock in CLOCKS} for name in ("padded", "packed")
            }
            vectors: dict[str, list[npt.NDArray[np.float32]]] = {"padded": [], "packed": []}
            for round_ in range(args.rounds):
                for index, batch in enumerate(batches):
                    ids = [row for row, _ in batch]
                    types = [row_types for _, row_types in batch] if uses_types else None
                    pair = [("padded", padded), ("packed", packed)]
                    for name, runner in pair if (round_ + index) % 2 == 0 else pair[::-1]:
                        started = {clock: read() for clock, read in CLOCKS.items()}
                        out = runner.run_texts(ids, types)
                        for clock, read in CLOCKS.items():
                            times[name][clock][index].append(read() - started[clock])
                        if round_ == 0:
                            vectors[name].append(out)
            a, b = np.concatenate(vectors["padded"]), np.concatenate(vectors["packed"])
            cosine = (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)
            real = sum(len(row) for row, _ in ordered)
            computed = sum(len(batch) * max(len(row) for row, _ in batch) for batch in batches)
            best = {
                name: {clock: sum(min(samples) for samples in by_batch) for clock, by_batch in clocks.items()}
                for name, clocks in times.items()
            }
            results.append({
                "order": order,
                "batch": size,
                "padding_share": round(1 - real / computed, 3),
                "padded_ms_per_sentence": round(1000 * best["padded"]["wall"] / len(ordered), 3),
                "packed_ms_per_sentence": round(1000 * best["packed"]["wall"] / len(ordered), 3),
                "packed_over_padded": round(best["packed"]["wall"] / best["padded"]["wall"], 3),
                "cpu_packed_over_padded": round(best["packed"]["cpu"] / best["padded"]["cpu"], 3),
                "min_cosine": round(float(cosine.min()), 7),
                "max_abs_difference": float(np.abs(a - b).max()),
            })  # fmt: skip
            print(json.dumps(results[-1]), flush=True)
    print(json.dumps(report, indent=1))
    if args.out:
        args.out.write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
