"""`--dtype int8` on a CPU without VNNI, emulated on this one, against float32 (an AVX2 host's default), in one
process (issue 33).

    python -m bench.int8_without_vnni [--threads 2] [--rounds 10] [--sentences 256] [--sizes 32,16,8,1]

The bench runs itself again in a process where oneDNN is held to AVX2 (its own `ONEDNN_MAX_CPU_ISA`) and torch's
kernels too (`ATEN_CPU_CAPABILITY=avx2`), where the loader finds no native bfloat16 (it reads oneDNN's cap, as an
AVX2 CPU's flags would say). There it loads the bundled model as the engine does in float32 and in
`--dtype int8` (7-bit weights where the int8 products saturate: engine_core/int8_linear.py), and tries `--dtype int8`
with 8-bit weights, which its probe check refuses (the refusal, with its cosine, is printed). Accuracy: int8's lowest
cosine against float32 over `--sentences` bench corpus sentences and over the probe set, in 8 batchings. Speed: passes
of `--sizes` corpus sentences on `--threads` torch threads, the two models alternating within each of `--rounds`
rounds: the lowest and the median ms a pass, and int8 / float32. The emulation keeps this host's caches, clock and
memory: it says what the instructions cost, not what a given AVX2 machine runs. docs/benchmarks.md, "The fast mode
on a CPU without VNNI".
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

HELD_TO = {"ONEDNN_MAX_CPU_ISA": "AVX2", "ATEN_CPU_CAPABILITY": "avx2"}


def main() -> None:
    from bench.int8_feed_forward import speed_and_accuracy_parser

    args = speed_and_accuracy_parser(__doc__ or "", "32,16,8,1").parse_args()
    if any(os.environ.get(name) != value for name, value in HELD_TO.items()):
        # the instruction sets are read when torch loads: a process of its own
        env = {**os.environ, **HELD_TO, "HF_HUB_OFFLINE": "1"}
        again = [sys.executable, "-m", "bench.int8_without_vnni", *sys.argv[1:]]
        sys.exit(subprocess.run(again, env=env, check=False).returncode)
    measure(args)


def measure(args: argparse.Namespace) -> None:
    import torch

    from bench.int8_feed_forward import print_accuracy, print_pass_times, tokenizer_of
    from engine_core import int8_linear
    from engine_core.folder_choices import LoadError
    from engine_core.load_model import load_model
    from poolserve.config import Config

    torch.set_num_threads(args.threads)
    print(json.dumps({"int8_products_saturate": int8_linear.products_saturate(), **HELD_TO}), flush=True)
    models = {"float32": load_model(Config(device="cpu", dtype="float32", runtime="torch"))}
    models["int8"] = load_model(Config(device="cpu", dtype="int8", runtime="torch"))
    seven_bit = int8_linear.WEIGHT_LEVELS_SATURATING
    setattr(int8_linear, "WEIGHT_LEVELS_SATURATING", int8_linear.WEIGHT_LEVELS)  # noqa: B010 (set back below)
    try:
        load_model(Config(device="cpu", dtype="int8", runtime="torch"))
        eight_bit = "served"
    except LoadError as exc:
        eight_bit = str(exc)
    finally:
        setattr(int8_linear, "WEIGHT_LEVELS_SATURATING", seven_bit)  # noqa: B010
    print(json.dumps({"int8_with_8_bit_weights": eight_bit}), flush=True)
    tokenize = tokenizer_of(models["float32"])
    print_accuracy(models["float32"], {"int8": models["int8"]}, tokenize, args.sentences)
    print_pass_times(models, tokenize, args, over=("int8", "float32"))


if __name__ == "__main__":
    main()
