"""`--dtype int8`'s layers and the bundled model on one thread: int8 against bfloat16 and float32 (issue 33 step 3).

    python -m bench.int8_trial [--rounds 8] [--model-only | --layers-only]

Per layer (MiniLM's shapes: 384 -> 384, and 384 -> 1536 followed by GELU) at 16, 512 and 640 rows (one sentence,
32 sentences and 16 inputs of 40 tokens, packed): float32 and bfloat16 linear, the int8 layer's input quantisation
(engine_core/int8_linear.py's InputQuantizer), its fused int8 product alone, and the whole int8 layer. Then the
bundled model through the engine's runner on the same three batches, loaded with `--dtype auto` (bfloat16 where the
CPU has it), `--dtype int8` and `--dtype float32`. Each figure is the lowest mean over `--rounds` rounds, the
candidates alternating within a round, so that a noisy neighbour hits them all; compare within one run.
docs/benchmarks.md, "The fast mode", holds the figures.
"""

from __future__ import annotations

import argparse
import functools
import random
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt
import torch
import torch.nn.functional as F

if TYPE_CHECKING:
    from tokenizers import Tokenizer

    from engine_core.loader import LoadedModel

SHAPES = ((384, 384, False), (384, 1536, True))
ROWS = (16, 512, 640)


def race(candidates: dict[str, Callable[[], object]], rounds: int, calls: int) -> dict[str, float]:
    """Each candidate's lowest mean ms per call over `rounds` rounds of `calls` calls, alternating."""
    best = dict.fromkeys(candidates, float("inf"))
    for run in candidates.values():
        run()
    for _ in range(rounds):
        for name, run in candidates.items():
            started = time.perf_counter()
            for _ in range(calls):
                run()
            best[name] = min(best[name], (time.perf_counter() - started) / calls * 1e3)
    return best


def time_layers(rounds: int) -> None:
    torch.manual_seed(0)
    for rows in ROWS:
        for inputs, outputs, is_gelu in SHAPES:
            best = time_layer(rows, inputs, outputs, is_gelu, rounds)
            shape = f"{rows} x {inputs} -> {outputs}{' + GELU' if is_gelu else ''}"
            print(f"{shape}: " + ", ".join(f"{name} {ms:.3f}" for name, ms in best.items()) + " ms", flush=True)


def time_layer(rows: int, inputs: int, outputs: int, is_gelu: bool, rounds: int) -> dict[str, float]:
    from engine_core.int8_linear import InputQuantizer, Int8Linear

    linear = torch.nn.Linear(inputs, outputs)
    wide = torch.randn(rows, inputs)
    narrow = wide.bfloat16()
    half = torch.nn.Linear(inputs, outputs).bfloat16()
    balance = torch.rand(inputs) + 0.5
    quantizer = InputQuantizer(1 / balance)
    layer = Int8Linear(half, quantizer, balance, is_gelu=is_gelu)  # made, as the loader makes it, from bfloat16
    act: Callable[[torch.Tensor], torch.Tensor] = F.gelu if is_gelu else torch.nn.Identity()
    q = quantizer(narrow)

    def quantize() -> object:
        quantizer.last = None  # as for a new input
        return quantizer(narrow)

    def product() -> object:
        return torch.ops.onednn.qlinear_pointwise(
            q.values, q.step, q.zero, layer.packed_weight, layer.weight_scale, layer.weight_zero, layer.bias,
            1.0, 0, torch.bfloat16, layer.post_op, [], "none" if is_gelu else "",
        )  # fmt: skip

    def whole() -> object:
        quantizer.last = None
        return layer(narrow)

    with torch.inference_mode():
        return race(
            {
                "float32": lambda: act(linear(wide)),
                "bfloat16": lambda: act(half(narrow)),
                "int8 quantise": quantize,
                "int8 product": product,
                "int8 layer": whole,
            },
            rounds,
            calls=20,
        )


def time_model(rounds: int) -> None:
    from tokenizers import Tokenizer

    from engine_core.load_model import load_model
    from poolserve.config import Config

    models = {
        name: load_model(Config(device="cpu", dtype=name, runtime="torch")) for name in ("auto", "int8", "float32")
    }
    ids = corpus_ids(Tokenizer.from_str(models["auto"].card.tokenizer_json))
    batches = {
        "1 x 16 tokens": [ids[0][:16]],
        "32 x 16": [row[:16] for row in ids[:32]],
        "16 x 40": [np.resize(row, 40) for row in ids[32:48]],
    }
    for label, batch in batches.items():
        best = race(runs_of(models, batch), rounds, calls=3)
        line = ", ".join(f"{name} {ms:.2f}" for name, ms in best.items())
        print(f"{label}: {line} ms; int8 / bf16 {best['int8'] / best['auto']:.2f}", flush=True)


def corpus_ids(backend: Tokenizer) -> list[npt.NDArray[np.int32]]:
    """48 bench corpus sentences' token ids, the same every run: the batches the model timings are cut from."""
    from bench.harness.corpus import make_sentence

    rng = random.Random(0)
    return [np.asarray(backend.encode(make_sentence(rng)).ids, dtype=np.int32) for _ in range(48)]


def runs_of(models: Mapping[str, LoadedModel], batch: list[npt.NDArray[np.int32]]) -> dict[str, Callable[[], object]]:
    """Each model's runner on `batch`, as race() takes candidates."""
    return {name: functools.partial(model.runner.run_texts, batch, None) for name, model in models.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=8)
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--layers-only", action="store_true")
    which.add_argument("--model-only", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(1)
    if not args.model_only:
        time_layers(args.rounds)
    if not args.layers_only:
        time_model(args.rounds)


if __name__ == "__main__":
    main()
