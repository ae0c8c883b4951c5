"""The packed encoder's joined layers against the way before them, in-process (engine_core/packed_encoder.py).

    python -m bench.packed_ways --way join [--dtype float32,auto,int8] [--inputs 1,2,16,32] [--sentences 400]
    python -m bench.packed_ways --way attention [--dtype float32] [--inputs 1,2,16,32] [--sentences 400]
    python -m bench.packed_ways --shapes
    (each also takes --threads N; else torch's default count, set as the engine sets it)

`--way join`: a layer's query, key and value in one product (`join_projections`): the bundled model loaded twice in
one process as the engine loads it (`load_model`, `--runtime torch`), as served and with the loader's join step left
out. `--way attention`: a joined layer's attention as batched products (`attention`) against torch's fused kernel in
its place, on one load. Either way passes of `--inputs` bench corpus sentences run one each way in turn, the order
flipped every pass, so that this shared host's drift hits both alike; printed per dtype and pass size: sentences a
second each way, the ratio, and the lowest cosine between their answers.

`--shapes`: the attention call alone in float32 on grids of MiniLM's heads (12 x 32) of a few input counts and widths,
half the inputs' keys cut short: microseconds a call each way, and the largest difference from the kernel's answer.

The thread count is set (`torch.set_num_threads`) as the engine sets it: that call also changes how MKL threads the
products inside torch's fused attention kernel, which then took 1.7-2 x as long on these grids (docs/benchmarks.md,
"Attention as products").
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
Batch = list[np.ndarray]
Run = Callable[[Batch], np.ndarray]


def kernel(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor | None, scale: float
) -> torch.Tensor:
    return F.scaled_dot_product_attention(query, key, value, attn_mask=mask, scale=scale)


def microseconds(call: Callable[[], object], times: int = 300) -> float:
    for _ in range(20):
        call()
    started = time.perf_counter()
    for _ in range(times):
        call()
    return (time.perf_counter() - started) / times * 1e6


def shapes(times: int) -> None:
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
            timings[name] = round(microseconds(call, times), 1)
            errors[name] = f"{float((call() - exact).abs().max()):.1e}"
        print(json.dumps({
            "inputs": count, "width": width, "threads": torch.get_num_threads(), "microseconds": timings,
            "kernel_over_products": round(timings["kernel"] / timings["products"], 2), "max_difference": errors,
        }), flush=True)  # fmt: skip


def compare(ways: dict[str, Run], batches: list[Batch], sentences: int) -> tuple[dict[str, float], float]:
    """Sentences a second each way (first named the base), passes alternated one by one, and the lowest cosine
    between the two ways' answers."""
    for run in ways.values():  # warm: oneDNN builds its kernels for the row counts met
        for batch in batches:
            run(batch)
    a, b = (run(batches[0]) for run in ways.values())
    cosine = float(((a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)).min())
    inputs = len(batches[0])
    count = max(40, sentences // inputs)
    spent = dict.fromkeys(ways, 0.0)
    for i in range(count):
        for name in list(ways) if i % 2 == 0 else list(ways)[::-1]:
            started = time.perf_counter()
            ways[name](batches[i % len(batches)])
            spent[name] += time.perf_counter() - started
    return {name: round(count * inputs / seconds, 1) for name, seconds in spent.items()}, cosine


def passes(args: argparse.Namespace) -> None:
    from tokenizers import Tokenizer

    from bench.pass_contention import corpus_batches
    from engine_core import loader, packed_encoder
    from engine_core.load_model import load_model
    from engine_core.runner import ModelRunner
    from poolserve.config import Config

    ours = packed_encoder.attention

    def with_attention(way: Callable[..., torch.Tensor], runner: ModelRunner) -> Run:
        def run(batch: Batch) -> np.ndarray:
            packed_encoder.attention = way
            try:
                return runner.run_texts(batch, None)
            finally:
                packed_encoder.attention = ours

        return run

    for dtype in args.dtype.split(","):
        config = Config(device="cpu", dtype=dtype, runtime="torch")
        loaded = load_model(config)
        served = loaded.runner
        if args.way == "join":
            step = loader.join_attention_projections
            loader.join_attention_projections = lambda *args, **kwargs: None  # the step left out: nothing joined
            try:
                apart = load_model(config).runner
            finally:
                loader.join_attention_projections = step
            ways: dict[str, Run] = {"apart": functools.partial(apart.run_texts, type_rows=None)}
            ways["joined"] = functools.partial(served.run_texts, type_rows=None)
        else:
            ways = {"kernel": with_attention(kernel, served), "products": with_attention(ours, served)}
        tokenizer = Tokenizer.from_str(loaded.card.tokenizer_json)

        def ids(text: str, tokenizer: Tokenizer = tokenizer) -> list[int]:
            return tokenizer.encode(text).ids

        for inputs in map(int, args.inputs.split(",")):
            rates, cosine = compare(ways, corpus_batches(ids, inputs, 16), args.sentences)
            base, new = rates.values()
            print(json.dumps({
                "way": args.way, "dtype": dtype, "inputs": inputs, "threads": torch.get_num_threads(),
                "sentences_per_s": rates, "ratio": round(new / base, 3), "min_cosine": round(cosine, 7),
            }), flush=True)  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--way", choices=["join", "attention"], default="join")
    parser.add_argument("--dtype", default="", help="comma-separated; default: float32,auto,int8 to join, float32")
    parser.add_argument("--inputs", default="1,2,16,32")
    parser.add_argument(
        "--sentences", type=int, default=400, help="Sentences each way per pass size (at least 40 passes)."
    )
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default count)")
    parser.add_argument("--shapes", action="store_true", help="Time the attention call alone on a few grids.")
    parser.add_argument("--times", type=int, default=300, help="--shapes: calls timed each way and grid.")
    args = parser.parse_args()
    args.dtype = args.dtype or ("float32,auto,int8" if args.way == "join" else "float32")
    torch.set_num_threads(args.threads or torch.get_num_threads())
    if args.shapes:
        shapes(args.times)
    else:
        passes(args)


if __name__ == "__main__":
    main()
