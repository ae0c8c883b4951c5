"""torch.compile of the engine's encoder against eager, start-up cost included (issue 17's trial).

    python -m bench.compile_trial

The bundled model through the engine's own runner, 512 corpus sentences sorted by length in
batches of 32, one torch thread: eager, then `torch.compile(model, dynamic=True)` (its compile
time and the first batches timed apart), then eager again. docs/benchmarks.md, "CPU engine".
"""

from __future__ import annotations

import random
import time

import numpy as np
import torch
from tokenizers import Tokenizer

from bench.harness.corpus import make_sentence
from engine_core.load_model import load_model
from poolserve.config import Config


def main() -> None:
    torch.set_num_threads(1)
    loaded = load_model(Config(device="cpu", api_server_count=1, runtime="torch"))
    runner = loaded.runner
    backend = Tokenizer.from_str(loaded.card.tokenizer_json)
    rng = random.Random(0)
    rows = sorted((np.asarray(backend.encode(make_sentence(rng)).ids, dtype=np.int32) for _ in range(512)), key=len)
    batches = [rows[i : i + 32] for i in range(0, len(rows), 32)]

    def rate(label: str) -> float:
        started = time.perf_counter()
        for batch in batches:
            runner.run_texts(batch, None)
        per_s = len(rows) / (time.perf_counter() - started)
        print(f"{label}: {per_s:.1f} sentences/s", flush=True)
        return per_s

    rate("eager, warm-up")
    eager = [rate("eager")]
    model = runner.model  # type: ignore[attr-defined]
    started = time.perf_counter()
    runner.model = torch.compile(model, dynamic=True)  # type: ignore[attr-defined]
    for batch in batches[:3]:
        runner.run_texts(batch, None)
    print(f"compile and the first 3 batches: {time.perf_counter() - started:.1f} s", flush=True)
    rate("compiled, warm-up")
    compiled = rate("compiled")
    runner.model = model  # type: ignore[attr-defined]
    eager.append(rate("eager again"))
    print(f"compiled / eager (best): {compiled / max(eager):.3f}")


if __name__ == "__main__":
    main()
