"""Small passes in-process: torch's packed runners against ONNX Runtime's graph (`--runtime hybrid`, issue 33).

    python -m bench.small_pass_trial [--rounds 40] [--sizes 1,2,4,16] [--onnx-cache-dir DIR]

The bundled model's runners as the engine loads them: `--dtype float32` (torch, packed) on 1 and 2 threads, `--dtype
int8` on 2, and the cached ONNX graph on sessions of 1 and 2 threads, spinning between passes (ONNX Runtime's default)
and not ("no spin": spinning within a pass only, what the engine makes; bench.graph_spin); with `make bench-onnx-peer`
done, also Infinity's own optimised fp32 and int8 graphs (bench/.models/onnx/) on 2 threads. Each candidate runs its
rounds in a block (after 3 warm-up passes), since alternating them lets one runtime's spinning threads slow the
other's next pass; the second table alternates a torch pass with a graph pass, with and without the graph's spinning,
to show exactly that. Batches are corpus sentences, length-sorted; figures are the median and lowest ms per batch.
Compare within one run. docs/benchmarks.md, "Small passes through ONNX Runtime", holds the figures.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

import numpy as np
import torch
from tokenizers import Tokenizer

from bench.harness.corpus import make_sentences
from engine_core.load_model import load_model
from engine_core.onnx_runtime import OnnxEncoder, new_session
from engine_core.runner import EmbeddingRunner, ModelRunner, Rows
from poolserve.config import Config

PEER_GRAPHS = Path(__file__).parent / ".models" / "onnx"


class PeerGraph:
    """Infinity's graph run as Infinity runs it: padded ids, mask and segments, mean pooling over the mask."""

    def __init__(self, path: Path, threads: int):
        self.session = new_session(path, threads)

    def run_texts(self, rows: Rows, type_rows: None) -> np.ndarray:
        ids = np.zeros((len(rows), max(len(row) for row in rows)), dtype=np.int64)
        mask = np.zeros_like(ids)
        for i, row in enumerate(rows):
            ids[i, : len(row)], mask[i, : len(row)] = row, 1
        (hidden,) = self.session.run(None, {"input_ids": ids, "attention_mask": mask, "token_type_ids": 0 * ids})
        return np.asarray((hidden * mask[..., None]).sum(1) / mask.sum(1, keepdims=True))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--sizes", default="1,2,4,16")
    parser.add_argument("--onnx-cache-dir", default="")
    args = parser.parse_args()
    float32 = load_model(Config(device="cpu", dtype="float32", runtime="torch"))
    int8 = load_model(Config(device="cpu", dtype="int8", runtime="torch"))
    hybrid = load_model(Config(device="cpu", dtype="float32", runtime="hybrid", onnx_cache_dir=args.onnx_cache_dir))
    graph = hybrid.runner.small.model.path  # type: ignore[attr-defined]
    card = hybrid.card
    tokenizer = Tokenizer.from_str(card.tokenizer_json)
    rows = [np.asarray(e.ids, dtype=np.int32) for e in tokenizer.encode_batch(make_sentences(64, 0))]

    def graph_on(threads: int, *, spin: bool) -> EmbeddingRunner:
        encoder = OnnxEncoder(graph, threads, small_session=False, spin=spin)
        return EmbeddingRunner(encoder, pooling=("mean",), pad_token_id=card.pad_token_id, device=torch.device("cpu"))

    # each candidate: something with the runners' run_texts, and its threads
    candidates: dict[str, tuple[ModelRunner | PeerGraph, int]] = {
        "torch float32, 1 thread": (float32.runner, 1),
        "torch float32, 2 threads": (float32.runner, 2),
        "torch int8, 2 threads": (int8.runner, 2),
    }
    for threads in (1, 2):
        for spin in (True, False):
            name = f"graph, {threads} thread{'s' * (threads > 1)}{'' if spin else ', no spin'}"
            candidates[name] = (graph_on(threads, spin=spin), threads)
    for variant, file in (("fp32", "model_optimized.onnx"), ("int8", "model_quantized_optimized.onnx")):
        if (PEER_GRAPHS / variant / file).is_file():
            candidates[f"Infinity's {variant} graph, 2 threads"] = (PeerGraph(PEER_GRAPHS / variant / file, 2), 2)
    print(f"bundled model, corpus sentences; load average at start {os.getloadavg()}")

    def batch(round_: int, size: int) -> list[np.ndarray]:
        start = (round_ * size) % len(rows)
        return sorted((rows * 2)[start : start + size], key=len)

    for size in (int(s) for s in args.sizes.split(",")):
        for name, (runner, threads) in candidates.items():
            torch.set_num_threads(threads)
            time.sleep(0.5)
            ms = []
            for round_ in range(args.rounds + 3):
                began = time.perf_counter()
                runner.run_texts(batch(round_, size), None)
                if round_ >= 3:
                    ms.append((time.perf_counter() - began) * 1000)
            print(f"{size:>2} sentence(s), {name:<34} median {statistics.median(ms):7.2f} ms, lowest {min(ms):7.2f}")
    torch.set_num_threads(2)
    print("alternated, one sentence a pass, 2 threads: torch float32's pass, then the graph's")
    for spin in (True, False):
        pair: dict[str, ModelRunner] = {"torch": float32.runner, "graph": graph_on(2, spin=spin)}
        times: dict[str, list[float]] = {"torch": [], "graph": []}
        for round_ in range(args.rounds):
            for name, one in pair.items():
                began = time.perf_counter()
                one.run_texts(batch(round_, 1), None)
                times[name].append((time.perf_counter() - began) * 1000)
        figures = [f"{n} median {statistics.median(v):.2f} ms (lowest {min(v):.2f})" for n, v in times.items()]
        print(f"  graph {'spinning' if spin else 'not spinning'}: {', '.join(figures)}")
    print(f"load average at end {os.getloadavg()}")


if __name__ == "__main__":
    main()
