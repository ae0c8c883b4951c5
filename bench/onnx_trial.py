"""`--runtime onnxruntime` against torch, in-process, float32, the bundled model (issue 33 step 2).

    python -m bench.onnx_trial [--rounds 20] [--onnx-cache-dir DIR]

The engine's own runners, loaded as `launch --dtype float32` loads them (torch: token packing, the default) and as
`--runtime onnxruntime` does, on one corpus sentence at a time and on batches of 32 corpus sentences (length-sorted,
as the scheduler cuts them), each on 1 and on 2 threads (torch's intra-op threads; ONNX Runtime's session of that
many threads). The candidates alternate within each round, so that a noisy neighbour hits them all; figures are the
median and the lowest ms per batch over the rounds (the first round left out: warm-up). Compare within one run.
docs/benchmarks.md, "The ONNX Runtime peer", holds the figures.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import numpy as np
import torch
from tokenizers import Tokenizer

from bench.harness.corpus import make_sentences
from engine_core.load_model import load_model
from engine_core.onnx_runtime import OnnxEncoder
from engine_core.runner import EmbeddingRunner, ModelRunner
from poolserve.config import Config


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--onnx-cache-dir", default="")
    args = parser.parse_args()
    torch_loaded = load_model(Config(device="cpu", dtype="float32", runtime="torch"))
    onnx_loaded = load_model(
        Config(device="cpu", dtype="float32", runtime="onnxruntime", onnx_cache_dir=args.onnx_cache_dir)
    )
    encoder = onnx_loaded.runner.model  # type: ignore[attr-defined]
    assert isinstance(encoder, OnnxEncoder)
    card = onnx_loaded.card
    tokenizer = Tokenizer.from_str(card.tokenizer_json)
    texts = make_sentences(64, 0)
    rows = [np.asarray(e.ids, dtype=np.int32) for e in tokenizer.encode_batch(texts)]
    print(f"bundled model, {len(rows)} corpus sentences, mean {np.mean([len(r) for r in rows]):.1f} tokens; "
          f"load average at start {os.getloadavg()}")  # fmt: skip

    def onnx_on(threads: int) -> ModelRunner:
        """The ONNX runner with every batch, small or not, on a session of `threads` threads."""
        pinned = OnnxEncoder(encoder.path, threads, small_session=False)
        return EmbeddingRunner(pinned, pooling=("mean",), pad_token_id=card.pad_token_id, device=torch.device("cpu"))

    candidates: dict[str, tuple[ModelRunner, int]] = {}
    for threads in (1, 2):
        candidates[f"torch {threads}t"] = (torch_loaded.runner, threads)
        candidates[f"onnxruntime {threads}t"] = (onnx_on(threads), threads)
    for size in (1, 32):
        times: dict[str, list[float]] = {name: [] for name in candidates}
        for round_ in range(args.rounds + 1):
            start = (round_ * size) % len(rows)
            batch = sorted((rows * 2)[start : start + size], key=len)
            for name, (runner, threads) in candidates.items():
                torch.set_num_threads(threads)
                began = time.perf_counter()
                runner.run_texts(batch, None)
                if round_:
                    times[name].append((time.perf_counter() - began) * 1000)
        for name, ms in times.items():
            print(f"{size:>2} sentence(s), {name:<15} median {statistics.median(ms):8.2f} ms, lowest {min(ms):8.2f} ms")
    print(f"load average at end {os.getloadavg()}")


if __name__ == "__main__":
    main()
