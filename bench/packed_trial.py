"""Token packing against the padded forward pass on this machine: speed and agreement, batch by batch.

    python -m bench.packed_trial [--sentences 512] [--batches 1,8,16,32] [--rounds 3] [--dtype float32]

Loads the bundled model with the engine's own loader and runs the same batches of bench corpus
sentences through its runner padded (`--token-packing off`) and packed
(engine_core/packed_encoder.py), the two alternated batch by batch for `--rounds` rounds so that a
noisy neighbour hits both. Two orders: `arrival` (batches of consecutive corpus sentences, as the
scheduler fills them from whatever is waiting) and `sorted` (the corpus sorted by length first, the
least padding a length-sorted cut can reach). Reports each batch size's seconds per sentence
(best round), the packed/padded ratio, the share of the padded pass's tokens that were padding,
and the lowest cosine between a sentence's two vectors. docs/benchmarks.md, "CPU engine".
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
import numpy.typing as npt

from bench.machine import cpu_model
from bench.workloads import corpus_sentences


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sentences", type=int, default=512)
    parser.add_argument("--batches", default="1,8,16,32", help="Batch sizes, comma-separated.")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    from tokenizers import Tokenizer

    from engine_core.loader import load_model
    from engine_core.runner import EmbeddingRunner
    from poolserve.config import Config

    loaded = load_model(Config(device="cpu", dtype=args.dtype, token_packing="off"))
    padded = loaded.runner
    assert isinstance(padded, EmbeddingRunner)
    packed = EmbeddingRunner(padded.model, pooling=("mean",), pad_token_id=padded.pad_token_id, device=padded.device,
                             packed=True)  # fmt: skip
    backend = Tokenizer.from_str(loaded.card.tokenizer_json)
    rows = [np.asarray(backend.encode(text).ids, dtype=np.int32) for text in corpus_sentences(args.seed)]
    rows = rows[: args.sentences]
    orders = {"arrival": rows, "sorted": sorted(rows, key=len)}
    report: dict[str, object] = {"cpu": cpu_model(), "dtype": args.dtype, "sentences": len(rows), "results": []}
    results: list[dict[str, object]] = report["results"]  # type: ignore[assignment]
    for order, ordered in orders.items():
        for size in (int(s) for s in args.batches.split(",")):
            batches = [ordered[i : i + size] for i in range(0, len(ordered), size)]
            seconds = {"padded": [0.0] * args.rounds, "packed": [0.0] * args.rounds}
            vectors: dict[str, list[npt.NDArray[np.float32]]] = {"padded": [], "packed": []}
            for round_ in range(args.rounds):
                for batch in batches:
                    for name, runner in (("padded", padded), ("packed", packed)):
                        started = time.perf_counter()
                        out = runner.run_texts(batch, None)
                        seconds[name][round_] += time.perf_counter() - started
                        if round_ == 0:
                            vectors[name].append(out)
            a, b = np.concatenate(vectors["padded"]), np.concatenate(vectors["packed"])
            cosine = (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)
            real = sum(len(row) for row in ordered)
            computed = sum(len(batch) * max(len(row) for row in batch) for batch in batches)
            best = {name: min(values) for name, values in seconds.items()}
            results.append({
                "order": order,
                "batch": size,
                "padding_share": round(1 - real / computed, 3),
                "padded_ms_per_sentence": round(1000 * best["padded"] / len(ordered), 3),
                "packed_ms_per_sentence": round(1000 * best["packed"] / len(ordered), 3),
                "packed_over_padded": round(best["packed"] / best["padded"], 3),
                "min_cosine": round(float(cosine.min()), 7),
            })  # fmt: skip
            print(json.dumps(results[-1]), flush=True)
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
