"""The offline ceiling: the engine's own model runner called in-process, no HTTP, no IPC.

    python -m bench.offline --workload a --batch-sizes 1,8,16,32,64 --seconds 3

Loads the workload's model with engine_core.load_model.load_model (the server's own loading code
and runner), prepares the workload's inputs as the API servers would (token ids, uint8 pixels),
then times runner.run_texts / run_images over the corpus at each batch size, in corpus order
and sorted by length (the scheduler sorts a window by length, so the sorted figure is what it
can approach). The best of all shapes is the ceiling a served figure is compared against.
Each is timed at each torch thread count given (default: 1 and all usable cores); the best
shape names its thread count. Single-input latency is timed at batch size 1. One core's
frontend rate (tokenize, or decode and resize) is reported too: it is what one API-server
process can at most feed.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any, get_args

import numpy as np
import numpy.typing as npt

from bench.harness.models import model_folder
from bench.harness.stats import summarize_latencies
from bench.harness.workloads import build_workload, corpus_jpegs, corpus_long_texts, corpus_sentences, resolve_name
from poolserve.config import DeviceKind, DType


def time_batches(
    run: Callable[[Sequence[Any]], object], inputs: Sequence[Any], batch: int, seconds: float, tokens: Sequence[int]
) -> dict[str, float]:
    """Items/s and tokens/s running `inputs` in chunks of `batch`, cycling for about `seconds`.

    The chunks are visited in a shuffled (seeded) order: a run cut short by `seconds` then samples
    the whole corpus. Visited in order, a length-sorted corpus would be timed on its shortest
    inputs only, and its items/s would overstate what the same corpus allows."""
    run(inputs[:batch])  # warm the shape
    starts = list(range(0, len(inputs), batch))
    random.Random(0).shuffle(starts)
    items = counted_tokens = 0
    start = time.perf_counter()
    step = 0
    while True:
        index = starts[step % len(starts)]
        step += 1
        chunk = [inputs[(index + i) % len(inputs)] for i in range(batch)]
        run(chunk)
        counted_tokens += sum(tokens[(index + i) % len(inputs)] for i in range(batch))
        items += batch
        elapsed = time.perf_counter() - start
        if elapsed >= seconds:
            return {"batch_size": batch, "items_per_s": items / elapsed, "tokens_per_s": counted_tokens / elapsed}


def time_single(run: Callable[[Sequence[Any]], object], inputs: Sequence[Any], seconds: float) -> dict[str, float]:
    latencies: list[float] = []
    deadline = time.perf_counter() + seconds
    index = 0
    while time.perf_counter() < deadline or len(latencies) < 20:
        item = inputs[index % len(inputs)]
        start = time.perf_counter()
        run([item])
        latencies.append(time.perf_counter() - start)
        index += 1
    return summarize_latencies(latencies)


def time_frontend(step: Callable[[Any], object], raw: Sequence[Any], seconds: float) -> float:
    """Per-second rate of one API server's preprocessing of one input, on one thread."""
    count = 0
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        step(raw[count % len(raw)])
        count += 1
    return count / (time.perf_counter() - start)


def measure(
    workload_name: str,
    batch_sizes: list[int],
    seconds: float,
    seed: int,
    thread_counts: list[int],
    *,
    device: DeviceKind = "cpu",
    dtype: DType = "auto",
) -> dict[str, Any]:
    import torch

    from engine_core.load_model import load_model
    from poolserve.config import Config

    workload = build_workload(workload_name, seed=seed)
    folder = model_folder(workload.model)
    started = time.perf_counter()
    loaded = load_model(Config(model=str(folder), device=device, dtype=dtype))
    default_threads = torch.get_num_threads()
    load_s = time.perf_counter() - started
    card, runner = loaded.card, loaded.runner

    run: Callable[[Sequence[Any]], object]
    frontend: Callable[[Any], object]
    if workload.name == "image":
        from apiserver.images.decode import load_image_pixels

        assert card.image is not None
        image = card.image
        raw: Sequence[Any] = corpus_jpegs(seed)

        def frontend(jpeg: bytes) -> npt.NDArray[np.uint8]:
            return load_image_pixels(jpeg, image, max_pixels=40_000_000, param="input")

        inputs: Sequence[Any] = [frontend(jpeg) for jpeg in raw]
        tokens = [card.image_tokens] * len(inputs)

        def run(chunk: Sequence[Any]) -> object:
            return runner.run_images(np.stack(chunk))
    else:
        from tokenizers import Tokenizer

        tokenizer = Tokenizer.from_str(card.tokenizer_json)
        tokenizer.no_padding()
        tokenizer.no_truncation()
        raw = corpus_long_texts(seed) if workload.name == "long" else corpus_sentences(seed)

        def frontend(text: str) -> npt.NDArray[np.int32]:
            return np.asarray(tokenizer.encode(text).ids, dtype=np.int32)

        inputs = [frontend(text) for text in raw]
        tokens = [len(row) for row in inputs]

        def run(chunk: Sequence[Any]) -> object:
            return runner.run_texts(chunk, None)

    order = sorted(range(len(inputs)), key=lambda i: tokens[i])
    sorted_inputs = [inputs[i] for i in order]
    sorted_tokens = [tokens[i] for i in order]
    shapes: list[dict[str, Any]] = []
    single: dict[int, dict[str, float]] = {}
    # torch's thread count is part of the shape: on a small or busy machine one thread can beat
    # two that wait on each other, and the engine's --torch-threads is a setting like batch size.
    for threads in thread_counts or [default_threads]:
        torch.set_num_threads(threads)
        for batch in batch_sizes:
            as_sent = time_batches(run, inputs, batch, seconds, tokens)
            by_length = time_batches(run, sorted_inputs, batch, seconds, sorted_tokens)
            shapes.append({**as_sent, "order": "corpus", "threads": threads})
            shapes.append({**by_length, "order": "length-sorted", "threads": threads})
            print(
                f"threads {threads} batch {batch:4d}: {as_sent['items_per_s']:8.1f}/s corpus order, "
                f"{by_length['items_per_s']:8.1f}/s length-sorted",
                file=sys.stderr,
            )
        single[threads] = time_single(run, inputs, min(seconds, 3.0))
    best = max(shapes, key=lambda shape: shape["items_per_s"])
    fastest_single = min(single.values(), key=lambda latency: latency["p50"])
    return {
        "workload": workload.name,
        "letter": workload.letter,
        "model": workload.model,
        "model_folder": str(folder),
        "load_s": load_s,
        "torch_threads": best["threads"],
        "torch_default_threads": default_threads,
        "device": card.device,
        "dtype": card.dtype,
        "mean_tokens": float(np.mean(tokens)),
        "shapes": shapes,
        "best": best,
        "single_latency_ms": fastest_single,
        "single_latency_ms_by_threads": {str(threads): latency for threads, latency in single.items()},
        "frontend_per_s_one_thread": time_frontend(frontend, raw, min(seconds, 2.0)),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else "")
    parser.add_argument("--workload", default="a", help="a|b|c|d (a and b share the corpus and the model).")
    parser.add_argument("--batch-sizes", default="1,8,16,32,64,128", help="Comma-separated batch sizes to time.")
    parser.add_argument("--seconds", type=float, default=3.0, help="Seconds per batch size and order.")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--threads", default="", help="torch thread counts to try, e.g. 1,2 (default: 1 and torch's default)."
    )
    parser.add_argument(
        "--device", default="cpu", choices=get_args(DeviceKind), help="The GPU run: bench/device/run.sh."
    )
    parser.add_argument("--dtype", default="auto", choices=get_args(DType), help="The engine's --dtype.")
    parser.add_argument("--out", default="")
    args = parser.parse_args(argv)
    sizes = [int(size) for size in args.batch_sizes.split(",") if size]
    threads = [int(count) for count in args.threads.split(",") if count]
    if not threads:
        import os

        threads = sorted({1, len(os.sched_getaffinity(0))})
    result = measure(
        resolve_name(args.workload), sizes, args.seconds, args.seed, threads, device=args.device, dtype=args.dtype
    )
    text = json.dumps(result)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
