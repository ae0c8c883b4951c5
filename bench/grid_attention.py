"""Attention on the packed encoder's grids as batched products against torch's fused kernel, in-process
(engine_core/packed_encoder.py's `attention`, which takes float32 on a CPU that way).

    python -m bench.grid_attention [--dtype float32] [--inputs 1,2,16,32] [--sentences 400] [--threads 0]
    python -m bench.grid_attention --shapes [--threads 0]

Loads the bundled model as the engine does (`load_model`, `--runtime torch`) and runs passes of `--inputs` bench corpus
sentences with the module's attention and with torch's `F.scaled_dot_product_attention` in its place, one pass each
way in turn, the order flipped every pass, so that this shared host's drift hits both alike. Printed per dtype and pass
size: sentences a second each way, products / kernel, and the lowest cosine between their answers. `--shapes`: the
attention call alone in float32 on grids of MiniLM's heads (12 x 32) of a few input counts and widths, half the inputs'
keys cut short: microseconds a call each way and the largest difference from the kernel's answer. The thread count is
set as the engine sets it (`--threads`, else torch's default count).
"""

from __future__ import annotations

import argparse
import functools
import json
import time
from collections.abc import Callable

import numpy as np
import torch
import torch.nn.functional as F

SHAPES = (
    (1, 16),
    (1, 48),
    (2, 32),
    (4, 40),
    (8, 24),
    (8, 48),
    (16, 40),
    (32, 32),
    (4, 64),
    (2, 96),
    (2, 128),
    (1, 256),
)


def microseconds(call: Callable[[], object], times: int = 300) -> float:
    for _ in range(20):
        call()
    started = time.perf_counter()
    for _ in range(times):
        call()
    return (time.perf_counter() - started) / times * 1e6


def kernel(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor | None, scale: float
) -> torch.Tensor:
    return F.scaled_dot_product_attention(query, key, value, attn_mask=mask, scale=scale)


def shapes() -> None:
    from engine_core.packed_encoder import attention

    for count, width in SHAPES:
        torch.manual_seed(0)
        query, key, value = (torch.randn(count, 12, width, 32) for _ in range(3))
        mask = torch.ones(count, 1, 1, width, dtype=torch.bool)
        mask[: (count + 1) // 2, ..., width // 2 :] = False
        exact = kernel(query, key, value, mask, 0.17)
        timings, errors = {}, {}
        for name, way in (("kernel", kernel), ("products", attention)):
            call = functools.partial(way, query, key, value, mask, 0.17)
            timings[name] = microseconds(call)
            errors[name] = f"{float((call() - exact).abs().max()):.1e}"
        print(json.dumps({
            "inputs": count, "width": width, "threads": torch.get_num_threads(), "microseconds": timings,
            "kernel_over_products": round(timings["kernel"] / timings["products"], 2), "max_difference": errors,
        }), flush=True)  # fmt: skip


def passes(args: argparse.Namespace) -> None:
    from tokenizers import Tokenizer

    from bench.pass_contention import corpus_batches
    from engine_core import packed_encoder
    from engine_core.load_model import load_model
    from engine_core.runner import ModelRunner
    from poolserve.config import Config

    ours = packed_encoder.attention
    ways = {"kernel": kernel, "products": ours}
    for dtype in args.dtype.split(","):
        loaded = load_model(Config(device="cpu", dtype=dtype, runtime="torch"))
        tokenizer = Tokenizer.from_str(loaded.card.tokenizer_json)

        def ids(text: str, tokenizer: Tokenizer = tokenizer) -> list[int]:
            return tokenizer.encode(text).ids

        def run(way: str, batch: list[np.ndarray], runner: ModelRunner = loaded.runner) -> np.ndarray:
            packed_encoder.attention = ways[way]
            try:
                return runner.run_texts(batch, None)
            finally:
                packed_encoder.attention = ours

        for inputs in map(int, args.inputs.split(",")):
            batches = corpus_batches(ids, inputs, 16)
            for way in ways:  # warm: oneDNN builds its kernels for the row counts met
                for batch in batches:
                    run(way, batch)
            a, b = run("kernel", batches[0]), run("products", batches[0])
            cosine = float(((a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)).min())
            count = max(40, args.sentences // inputs)
            spent = dict.fromkeys(ways, 0.0)
            for i in range(count):
                for way in list(ways) if i % 2 == 0 else list(ways)[::-1]:
                    started = time.perf_counter()
                    run(way, batches[i % len(batches)])
                    spent[way] += time.perf_counter() - started
            rate = {way: round(count * inputs / seconds, 1) for way, seconds in spent.items()}
            print(json.dumps({
                "dtype": dtype, "inputs": inputs, "threads": torch.get_num_threads(), "sentences_per_s": rate,
                "products_over_kernel": round(rate["products"] / rate["kernel"], 3), "min_cosine": round(cosine, 7),
            }), flush=True)  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--inputs", default="1,2,16,32")
    parser.add_argument(
        "--sentences", type=int, default=400, help="Sentences each way per pass size (at least 40 passes)."
    )
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: the engine's default)")
    parser.add_argument("--shapes", action="store_true", help="Time the attention call alone on a few grids.")
    args = parser.parse_args()
    # Set, as the engine sets it (engine_core/threads.py): torch.set_num_threads also changes how MKL threads the
    # products inside torch's fused attention kernel (it then took 1.7-2 x as long on these grids).
    torch.set_num_threads(args.threads or torch.get_num_threads())
    if args.shapes:
        shapes()
    else:
        passes(args)


if __name__ == "__main__":
    main()
