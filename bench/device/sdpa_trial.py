"""Why float16 batches of 8-64 ran 10x slower than float32 on the H100 (bench/device/run.sh offline):
a cost per new batch shape, in float16 only, which Sentence-Transformers' own encode showed too.

    python3 bench/device/sdpa_trial.py        # there, after run.sh's setup (PYTHONPATH)

Suspect: torch's cuDNN attention (scaled_dot_product_attention's first choice on Hopper for half
precision), which builds a cuDNN graph per shape. For each setting, times the engine's runner on
float16 over batches of new shapes (each (batch, length) seen for the first time) and over one
shape repeated, and prints one JSON line per setting.
"""

from __future__ import annotations

import json
import random
import statistics
import sys
import time

import numpy as np
import torch
from tokenizers import Tokenizer

from bench.harness.corpus import make_sentence
from engine_core.load_model import load_model
from poolserve.config import Config


def timed(run, batch) -> float:  # type: ignore[no-untyped-def]
    started = time.perf_counter()
    run(batch)
    return (time.perf_counter() - started) * 1000


def main() -> None:
    setting = sys.argv[1] if len(sys.argv) > 1 else "default"
    if setting == "no-cudnn-attention":
        torch.backends.cuda.enable_cudnn_sdp(False)
    loaded = load_model(Config(device="cuda", dtype="float16"))
    backend = Tokenizer.from_str(loaded.card.tokenizer_json)
    rng = random.Random(0)
    rows = [np.asarray(backend.encode(make_sentence(rng)).ids, dtype=np.int32) for _ in range(1024)]

    def run(batch: list[np.ndarray]) -> object:
        return loaded.runner.run_texts(batch, None)

    for size in (1, 8, 32, 64, 256):
        new_shape: list[float] = []
        same_shape: list[float] = []
        for longest in range(20, 44, 2):  # twelve (size, length) shapes this process has not run
            batch = [np.resize(rows[(size * longest + i) % len(rows)], longest if i == 0 else 12) for i in range(size)]
            new_shape.append(timed(run, batch))
            same_shape.extend(timed(run, batch) for _ in range(5))
        row = {"setting": setting, "batch": size, "new_shape_ms": round(statistics.median(new_shape), 2)}
        print(json.dumps({**row, "same_shape_ms": round(statistics.median(same_shape), 2)}), flush=True)


if __name__ == "__main__":
    main()
