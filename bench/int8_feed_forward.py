"""`--dtype int8` with BERT's feed-forward blocks in int8 whole (engine_core/int8_linear.py, `Int8FeedForward`) against
the same mode with the down projections in the model's dtype, in one process (issue 33).

    python -m bench.int8_feed_forward [--threads 2] [--rounds 10] [--sentences 256] [--sizes 32,16,8]

Loads the bundled model three times as the engine does (`load_model`): float32 (the reference), `--dtype int8` with
`quantize_feed_forwards` turned into a no-op from outside (the down projections in bfloat16 where native, as before
Int8FeedForward), and `--dtype int8` as shipped. Accuracy: each int8 model's lowest cosine against float32 over
`--sentences` bench corpus sentences and over the start-up probe set (engine_core/cpu_precision.py), run in batches
of 4, 8, 16 and 32 in two orders (the int8 layers' input scale is per batch, so a sentence's answer depends on its
batch-mates): the lowest and the median of those lowest. Speed: passes of `--sizes` corpus sentences on `--threads`
torch threads, the two models alternating within each of `--rounds` rounds: the lowest and the median ms a pass,
and shipped / before. docs/benchmarks.md, "The down projections in int8 through the intermediate product's uint8
output".
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt
import torch

if TYPE_CHECKING:
    from engine_core.loader import LoadedModel
    from poolserve.config import DType

Batch = list[npt.NDArray[np.int32]]


def load(dtype: DType, *, feed_forwards: bool = True) -> LoadedModel:
    """The bundled model as the engine loads it; without `feed_forwards`, the loader's step that puts BERT's
    feed-forward blocks in int8 whole does nothing (set from outside, for this comparison)."""
    from engine_core import loader
    from engine_core.load_model import load_model
    from poolserve.config import Config

    shipped = getattr(loader, "quantize_feed_forwards")  # noqa: B009 (set back below)
    if not feed_forwards:
        setattr(loader, "quantize_feed_forwards", lambda model, record: 0)  # noqa: B010
    try:
        return load_model(Config(device="cpu", dtype=dtype, runtime="torch"))
    finally:
        setattr(loader, "quantize_feed_forwards", shipped)  # noqa: B010


def embed(model: LoadedModel, ids: Batch, size: int) -> npt.NDArray[np.float32]:
    with torch.inference_mode():
        return np.concatenate(
            [np.asarray(model.runner.run_texts(ids[i : i + size], None)) for i in range(0, len(ids), size)]
        )


def lowest_cosines(reference: npt.NDArray[np.float32], model: LoadedModel, ids: Batch) -> list[float]:
    """The lowest cosine against `reference` in each batching: sizes 4, 8, 16, 32, in two orders."""
    lowest = []
    for size in (4, 8, 16, 32):
        for seed in range(2):
            order = list(range(len(ids)))
            random.Random(seed).shuffle(order)
            got = embed(model, [ids[i] for i in order], size)
            wanted = reference[order]
            cosines = np.einsum("ij,ij->i", got, wanted) / np.linalg.norm(got, axis=1) / np.linalg.norm(wanted, axis=1)
            lowest.append(float(cosines.min()))
    return lowest


def run_batch(model: LoadedModel, batch: Batch) -> object:
    return model.runner.run_texts(batch, None)


def pass_ms(models: dict[str, LoadedModel], batches: list[Batch], rounds: int) -> dict[str, list[float]]:
    """Each model's ms a pass over `batches`, per round, the models alternating (the order flips every round)."""
    times: dict[str, list[float]] = {name: [] for name in models}
    runs: dict[str, Callable[[Batch], object]] = {name: partial(run_batch, model) for name, model in models.items()}
    with torch.inference_mode():
        for run in runs.values():
            for batch in batches * 2:  # warm: oneDNN builds its kernels for the row counts met
                run(batch)
        for round_ in range(rounds):
            names = list(runs) if round_ % 2 == 0 else list(reversed(runs))
            for name in names:
                started = time.perf_counter()
                for batch in batches:
                    runs[name](batch)
                times[name].append((time.perf_counter() - started) / len(batches) * 1e3)
    return times


def print_pass_times(
    models: dict[str, LoadedModel],
    tokenize: Callable[[str], list[int]],
    args: argparse.Namespace,
    *,
    over: tuple[str, str],
) -> None:
    """A JSON line for each of `args.sizes`: the models' ms a pass (`pass_ms` over 8 batches of that many corpus
    sentences), lowest and median, and the ratio `over[0]` / `over[1]` of each, from the figures printed (rounded
    first), so that they can be checked against them."""
    from bench.pass_contention import corpus_batches

    for size in map(int, args.sizes.split(",")):
        times = pass_ms(models, corpus_batches(tokenize, size, 8), args.rounds)
        best = {name: round(min(values), 2) for name, values in times.items()}
        median = {name: round(statistics.median(values), 2) for name, values in times.items()}
        ratio = f"{over[0]}_over_{over[1]}"
        row = {"inputs": size, "threads": args.threads, "ms_lowest": best, "ms_median": median}
        row[ratio] = round(best[over[0]] / best[over[1]], 3)
        row[f"{ratio}_median"] = round(median[over[0]] / median[over[1]], 3)
        print(json.dumps(row), flush=True)


def speed_and_accuracy_parser(doc: str, sizes: str) -> argparse.ArgumentParser:
    """The options of both int8 benches: torch threads, rounds, corpus sentences, and the batch sizes timed."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--sentences", type=int, default=256)
    parser.add_argument("--sizes", default=sizes)
    return parser


def tokenizer_of(model: LoadedModel) -> Callable[[str], list[int]]:
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_str(model.card.tokenizer_json)

    def tokenize(text: str) -> list[int]:
        return list(tokenizer.encode(text).ids)

    return tokenize


def print_accuracy(
    reference_model: LoadedModel, models: dict[str, LoadedModel], tokenize: Callable[[str], list[int]], sentences: int
) -> None:
    """A JSON line per text set (`sentences` bench corpus sentences, the start-up probe set) and model: its lowest
    cosine against `reference_model` over the batchings of `lowest_cosines`, and the median of those lowest."""
    from bench.harness.corpus import make_sentence
    from engine_core.cpu_precision import PROBE_TEXTS

    rng = random.Random(0)
    texts = {"corpus": [make_sentence(rng) for _ in range(sentences)], "probe set": list(PROBE_TEXTS)}
    for name, group in texts.items():
        ids = [np.asarray(tokenize(text), dtype=np.int32) for text in group]
        reference = embed(reference_model, ids, 1)
        for label, model in models.items():
            lowest = lowest_cosines(reference, model, ids)
            summary = {"texts": name, "model": label, "cos_min": round(min(lowest), 5)}
            print(json.dumps(summary | {"median_of_lowest": round(statistics.median(lowest), 5)}), flush=True)


def main() -> None:
    args = speed_and_accuracy_parser(__doc__ or "", "32,16,8").parse_args()
    torch.set_num_threads(args.threads)
    reference_model = load("float32")
    models = {"before": load("int8", feed_forwards=False), "shipped": load("int8")}
    tokenize = tokenizer_of(reference_model)
    print_accuracy(reference_model, models, tokenize, args.sentences)
    print_pass_times(models, tokenize, args, over=("shipped", "before"))


if __name__ == "__main__":
    main()
