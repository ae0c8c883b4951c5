"""Linear weights packed once against packed at every call, the bundled model in-process (engine_core/packed_linear.py).

    python -m bench.weights_packed [--rounds 6] [--threads 1]

The bundled model through the engine's runner, loaded as the engine loads it (weights packed, and in float32 a
layer's GELU and residual adds done inside them: engine_core/fused_layers.py), with packing left out, and (float32)
packed without the fusing ("unfused"), in float32 and in `--dtype auto` (bfloat16 where the CPU has it), on a lone
sentence of 16 and of 30 tokens, 32 sentences of 16 and 16 inputs of 40. Each figure is the lowest mean ms over
`--rounds` rounds, the candidates alternating within a round (bench.int8_trial's race), so that a noisy neighbour
hits them all; compare within one run. docs/benchmarks.md, "Weights packed once", holds the figures.
"""

from __future__ import annotations

import argparse
from unittest import mock

import numpy as np
import numpy.typing as npt
import torch

from bench.int8_trial import corpus_ids, race, runs_of


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    from tokenizers import Tokenizer

    from engine_core.load_model import load_model
    from poolserve.config import Config

    models = {}
    for dtype in ("float32", "auto"):
        with mock.patch("engine_core.loader.can_pack", return_value=False):  # the model as it was served before
            models[f"{dtype} plain"] = load_model(Config(device="cpu", dtype=dtype, runtime="torch"))
        models[f"{dtype} packed"] = load_model(Config(device="cpu", dtype=dtype, runtime="torch"))
    with mock.patch("engine_core.loader.fuse_layers_checked", return_value=0):  # packed, GELU and adds apart
        models["float32 unfused"] = load_model(Config(device="cpu", dtype="float32", runtime="torch"))
    ids = corpus_ids(Tokenizer.from_str(models["auto packed"].card.tokenizer_json))
    batches: dict[str, list[npt.NDArray[np.int32]]] = {
        "1 x 16 tokens": [ids[0][:16]],
        "1 x 30": [np.resize(ids[1], 30)],
        "32 x 16": [row[:16] for row in ids[:32]],
        "16 x 40": [np.resize(row, 40) for row in ids[32:48]],
    }

    with torch.inference_mode():
        for label, batch in batches.items():
            best = race(runs_of(models, batch), args.rounds, calls=3)
            ratios = ", ".join(
                f"{dtype} packed / plain {best[f'{dtype} packed'] / best[f'{dtype} plain']:.2f}"
                for dtype in ("float32", "auto")
            )
            ratios += f", float32 packed / unfused {best['float32 packed'] / best['float32 unfused']:.2f}"
            figures = ", ".join(f"{name} {ms:.2f}" for name, ms in best.items())
            print(f"{label}: {figures} ms; {ratios}", flush=True)


if __name__ == "__main__":
    main()
