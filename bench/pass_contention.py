"""A CPU forward pass beside other work: why a served pass takes longer than the same pass in-process (issue 33).

    python -m bench.pass_contention [--dtype int8] [--runtime torch] [--inputs 16] [--passes 16] [--rounds 3]
        [--busy-ms 1] [--period-ms 6.7]

Served at 32 clients on 2 cores, a two-thread pass of ~17 sentences took 51 ms where the same batch takes 34-38 ms
in-process (docs/benchmarks.md, "A pass beside the API servers"). The API servers used 0.15 cores then. This loads
the bundled model as the engine does (`load_model`, `--dtype`), and serves batches of `--inputs` bench corpus
sentences through its runner in four ways, alternating within each round so that the host's drift hits them all:

- `whole`: one pass at a time on every torch thread (what the engine does under load);
- `lanes`: two Python threads, each running its own passes on one torch thread (the count is set before the second
  thread starts, which takes it as its first use of torch);
- `whole+other` and `lanes+other`: the same while a competitor process takes `--busy-ms` of CPU every `--period-ms`
  (by default 1 ms every 6.7 ms: 0.15 of a core, in bursts, as the API servers did).

Printed per round and at the end (the best round of each way): inputs per second; then `lanes / whole`, quiet and
beside the competitor, and `whole+other / whole`.
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import threading
import time
from collections.abc import Callable

import numpy as np
import numpy.typing as npt
import torch

# The competitor: a busy loop of `busy` seconds, then a sleep, every `period` seconds, until killed.
COMPETITOR = """
import sys, time
busy, period = float(sys.argv[1]), float(sys.argv[2])
while True:
    started = time.perf_counter()
    while time.perf_counter() - started < busy:
        pass
    time.sleep(max(0.0, period - busy))
"""

WAYS = ("whole", "lanes", "whole+other", "lanes+other")
Batch = list[npt.NDArray[np.int32]]


def corpus_batches(tokenize: Callable[[str], list[int]], inputs: int, count: int) -> list[Batch]:
    """`count` batches of `inputs` bench corpus sentences' token ids, the same every run."""
    from bench.harness.corpus import make_sentence

    rng = random.Random(0)
    return [[np.asarray(tokenize(make_sentence(rng)), dtype=np.int32) for _ in range(inputs)] for _ in range(count)]


def serve(run: Callable[[Batch], object], batches: list[Batch], passes: int, lanes: int) -> float:
    """Seconds to run `passes` batches: on this thread with every torch thread, or split over `lanes` threads (this
    one and `lanes - 1` more) with one torch thread each. A pass on every thread runs on this (the main) thread, as
    the engine's do: OpenMP's parallel regions started from another thread cost ~60 µs more each here (an add over
    512 x 384 floats: 74 against 14 µs), which a pass of a few hundred small operations feels."""
    whole = torch.get_num_threads()

    def lane(first: int) -> None:
        with torch.inference_mode():
            for index in range(first, passes, lanes):
                run(batches[index % len(batches)])

    if lanes > 1:
        torch.set_num_threads(1)
    try:
        started = time.perf_counter()
        others = [threading.Thread(target=lane, args=(first,)) for first in range(1, lanes)]
        for thread in others:
            thread.start()
        lane(0)
        for thread in others:
            thread.join()
        return time.perf_counter() - started
    finally:
        torch.set_num_threads(whole)


def start_competitor(busy_ms: float, period_ms: float) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", COMPETITOR, str(busy_ms / 1e3), str(period_ms / 1e3)])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", default="int8")
    parser.add_argument("--runtime", default="torch", help="--runtime as the engine takes it (default: torch)")
    parser.add_argument("--inputs", type=int, default=16)
    parser.add_argument("--passes", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--busy-ms", type=float, default=1.0)
    parser.add_argument("--period-ms", type=float, default=6.7)
    args = parser.parse_args()

    from tokenizers import Tokenizer

    from engine_core.load_model import load_model
    from poolserve.config import Config

    model = load_model(Config(device="cpu", dtype=args.dtype, runtime=args.runtime))
    tokenizer = Tokenizer.from_str(model.card.tokenizer_json)
    batches = corpus_batches(lambda text: tokenizer.encode(text).ids, args.inputs, 8)

    def run(batch: Batch) -> object:
        return model.runner.run_texts(batch, None)

    serve(run, batches, 4, 1)  # warm: oneDNN builds its kernels for the row counts met
    serve(run, batches, 4, 2)
    best = dict.fromkeys(WAYS, 0.0)
    for round_ in range(args.rounds):
        rates = {}
        for way in WAYS:
            competitor = start_competitor(args.busy_ms, args.period_ms) if way.endswith("+other") else None
            try:
                seconds = serve(run, batches, args.passes, 2 if way.startswith("lanes") else 1)
            finally:
                if competitor is not None:
                    competitor.kill()
                    competitor.wait()
            rates[way] = round(args.passes * args.inputs / seconds, 1)
            best[way] = max(best[way], rates[way])
        print(json.dumps({"round": round_, "inputs_per_s": rates}), flush=True)
    summary = {
        "dtype": model.card.dtype,
        "runtime": args.runtime,
        "inputs": args.inputs,
        "torch_threads": torch.get_num_threads(),
        "competitor_cores": round(args.busy_ms / args.period_ms, 3),
        "best_inputs_per_s": best,
        "lanes_over_whole": round(best["lanes"] / best["whole"], 2),
        "lanes_over_whole_beside_other": round(best["lanes+other"] / best["whole+other"], 2),
        "whole_beside_other_over_quiet": round(best["whole+other"] / best["whole"], 2),
    }
    print(json.dumps(summary), flush=True)


if __name__ == "__main__":
    main()
