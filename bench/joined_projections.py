"""A layer's query, key and value in one product against three, in-process (engine_core/packed_encoder.py's
join_projections).

    python -m bench.joined_projections [--dtype float32,auto,int8] [--inputs 1,2,16,32] [--sentences 400]
        [--threads 0]

Loads the bundled model twice in one process as the engine does (`load_model`, `--runtime torch`): as served (joined)
and with the loader's join step left out (apart), then runs passes of `--inputs` bench corpus sentences through each
in turn, one pass each, the order flipped every pass, so that this shared host's drift hits both alike. Printed per
dtype and pass size: sentences a second each way, joined / apart, and the lowest cosine between their answers.
`--threads 1`: a lane's one-thread pass.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
import torch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", default="float32,auto,int8")
    parser.add_argument("--inputs", default="1,2,16,32")
    parser.add_argument(
        "--sentences", type=int, default=400, help="Sentences each way per pass size (at least 40 passes)."
    )
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: the engine's default)")
    args = parser.parse_args()

    from tokenizers import Tokenizer

    from bench.pass_contention import corpus_batches
    from engine_core import loader
    from engine_core.load_model import load_model
    from poolserve.config import Config

    for dtype in args.dtype.split(","):
        joined = load_model(Config(device="cpu", dtype=dtype, runtime="torch"))
        real = loader.join_attention_projections
        loader.join_attention_projections = lambda *args, **kwargs: None  # the step left out: nothing joined
        try:
            apart = load_model(Config(device="cpu", dtype=dtype, runtime="torch"))
        finally:
            loader.join_attention_projections = real
        if args.threads:
            torch.set_num_threads(args.threads)
        tokenizer = Tokenizer.from_str(joined.card.tokenizer_json)

        def ids(text: str, tokenizer: Tokenizer = tokenizer) -> list[int]:
            return tokenizer.encode(text).ids

        runners = {"apart": apart.runner, "joined": joined.runner}
        for inputs in map(int, args.inputs.split(",")):
            batches = corpus_batches(ids, inputs, 16)
            for runner in runners.values():  # warm: oneDNN builds its kernels for the row counts met
                for batch in batches:
                    runner.run_texts(batch, None)
            first = {name: runner.run_texts(batches[0], None) for name, runner in runners.items()}
            a, b = first["apart"], first["joined"]
            cosine = float(((a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)).min())
            passes = max(40, args.sentences // inputs)
            spent = dict.fromkeys(runners, 0.0)
            for i in range(passes):
                batch = batches[i % len(batches)]
                for name in list(runners) if i % 2 == 0 else list(runners)[::-1]:
                    started = time.perf_counter()
                    runners[name].run_texts(batch, None)
                    spent[name] += time.perf_counter() - started
            rate = {name: round(passes * inputs / seconds, 1) for name, seconds in spent.items()}
            print(json.dumps({
                "dtype": dtype, "inputs": inputs, "threads": torch.get_num_threads(), "sentences_per_s": rate,
                "joined_over_apart": round(rate["joined"] / rate["apart"], 3), "min_cosine": round(cosine, 7),
            }), flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
