"""Whether CUDA graphs would lift the GPU's launch-bound pass: MiniLM's forward eager against one graph replay.

    python3 bench/device/graphs_trial.py [--device cuda] [--dtype float16]   # there, after run.sh's setup

On the H100 a pass of MiniLM cost 3-6 ms whatever its size up to 512 sentences: the host launching the pass's
kernels one by one, not the GPU's arithmetic (docs/benchmarks.md, "Offline ceiling on the GPU"). A CUDA graph
replays a captured pass with one launch. For each (batch, length) shape, rows of one length and a mask of ones (no
shape-dependent host work), this times, inputs already on the device: the model's forward eager; the same forward
captured once and replayed (new ids copied into the graph's input buffer first); and, for scale, the engine's runner
(`run_texts`: padding, copies, the pass, pooling, the copy back). Each timing is the mean of back-to-back calls ended
by one synchronisation: what a busy engine's passes cost. A forward that synchronises with the host (a check of the
mask's values, say) cannot be captured: the line says so, then the capture is tried again without the mask. Prints
one JSON line per shape. On a machine without CUDA (`--device cpu`) it times the eager parts only, to check itself.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from functools import partial
from typing import Any

import numpy as np
import torch

from engine_core.load_model import load_model
from poolserve.config import Config

CALLS = 20


def mean_ms(run: Callable[[], object], device: torch.device) -> float:
    """Mean ms of back-to-back calls, after three unmeasured ones, ended by one synchronisation."""
    for _ in range(3):
        run()
    sync(device)
    started = time.perf_counter()
    for _ in range(CALLS):
        run()
    sync(device)
    return round((time.perf_counter() - started) / CALLS * 1000, 3)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def captured(model: Any, inputs: dict[str, torch.Tensor]) -> tuple[Callable[[torch.Tensor], torch.Tensor], str]:
    """The forward captured in a CUDA graph over copies of `inputs`: (replay with these ids, "") or raises."""
    static = {name: tensor.clone() for name, tensor in inputs.items()}
    side = torch.cuda.Stream()  # type: ignore[no-untyped-call]
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up off the default stream, as torch's own recipe for capture says
        for _ in range(3):
            model(**static)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out: torch.Tensor = model(**static).last_hidden_state

    def replay(ids: torch.Tensor) -> torch.Tensor:
        static["input_ids"].copy_(ids, non_blocking=True)
        graph.replay()
        return out

    return replay, "with the mask" if "attention_mask" in inputs else "without the mask"


def measure(runner: Any, device: torch.device, size: int, length: int, generator: torch.Generator) -> dict[str, object]:
    """One shape's line: the runner, the forward eager, and the forward replayed from a graph (CUDA only)."""
    model = runner.model
    ids = torch.randint(1000, 29000, (size, length), generator=generator)
    ids[:, 0], ids[:, -1] = 101, 102  # [CLS] ... [SEP], as the tokenizer makes them
    rows = list(ids.numpy().astype(np.int32))
    ids = ids.to(device)
    inputs = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    row: dict[str, object] = {"batch": size, "length": length}
    row["runner_ms"] = mean_ms(lambda: runner.run_texts(rows, None), device)
    eager = model(**inputs).last_hidden_state
    row["eager_ms"] = mean_ms(lambda: model(**inputs), device)
    if device.type != "cuda":
        return row
    errors = []
    for tried in (inputs, {"input_ids": ids}):
        try:
            replay, how = captured(model, tried)
        except Exception as exc:  # a forward that cannot be captured says why
            errors.append(f"{type(exc).__name__}: {exc}"[:300])
            torch.cuda.synchronize()
            continue
        row["graph_ms"] = mean_ms(partial(replay, ids), device)
        row["graph"] = how
        row["graph_max_abs_diff"] = float((replay(ids) - eager).abs().max())
        break
    if errors:
        row["capture_errors"] = errors
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default="float16")
    parser.add_argument("--batches", default="1,8,32,128,256,512")
    parser.add_argument("--lengths", default="16,32")
    args = parser.parse_args()
    device = torch.device(args.device)
    loaded = load_model(Config(device=args.device, dtype=args.dtype, token_packing="off"))
    generator = torch.Generator().manual_seed(0)
    for size in map(int, args.batches.split(",")):
        for length in map(int, args.lengths.split(",")):
            with torch.inference_mode():
                row = measure(loaded.runner, device, size, length, generator)
            print(json.dumps({"dtype": args.dtype, **row}), flush=True)


if __name__ == "__main__":
    main()
