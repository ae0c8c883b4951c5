"""CPU and bytes of writing float32 vectors as JSON: `tolist()` + msgspec against
apiserver.requests.responses.float_rows.

    python -m bench.json_rows --repeat 7

Each way encodes an OpenAI-shaped `data` list of 1, 16 and 64 normalized 384-float rows (MiniLM's width);
the minimum time over `--repeat` rounds of `--number` encodes is printed, with the bytes written.
"""

from __future__ import annotations

import argparse
import functools
import json
import timeit
from collections.abc import Callable
from typing import Any

import msgspec
import numpy as np

from apiserver.requests.responses import float_rows

DIM = 384


def encode_data(encoder: msgspec.json.Encoder, vectors: Callable[[], list[Any]]) -> bytes:
    return encoder.encode([{"index": i, "embedding": vector} for i, vector in enumerate(vectors())])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--number", type=int, default=200)
    args = parser.parse_args()
    encoder = msgspec.json.Encoder()
    results = []
    for count in (1, 16, 64):
        rows = np.random.default_rng(0).standard_normal((count, DIM)).astype(np.float32)
        rows /= np.linalg.norm(rows, axis=1, keepdims=True)
        ways: dict[str, Callable[[], bytes]] = {
            "tolist": functools.partial(encode_data, encoder, rows.tolist),
            "float_rows": functools.partial(encode_data, encoder, functools.partial(float_rows, rows)),
        }
        row: dict[str, float] = {"rows": count}
        for name, encode in ways.items():
            seconds = min(timeit.repeat(encode, number=args.number, repeat=args.repeat)) / args.number
            row[f"{name}_us"] = round(seconds * 1e6, 1)
            row[f"{name}_bytes"] = len(encode())
        results.append(row)
        print(json.dumps(row))


if __name__ == "__main__":
    main()
