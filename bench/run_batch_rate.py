"""`launch run-batch` against the offline ceiling (issue 31): items/s of a texts job beside sentence-transformers'
own `encode` over the same sentences, one run each, alternated.

    python -m bench.run_batch_rate [--sentences 3000] [--rounds 2] [--dtype float32] [--job-flags "..."] [--out FILE]

The job's rate is its own summary line's (items written over the time from its server ready to its last line
written and the server stopped: the start-up, which a long job pays once, is left out). The ceiling is
`SentenceTransformer.encode(texts, batch_size=64)` in this process at the same precision, on every core torch
takes by default. Prints one JSON line per run and the ratio of the means.
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.harness.corpus import make_sentences
from bench.harness.models import bundled_model_folder

SUMMARY = re.compile(r"run-batch: (\d+) items written to .* in ([\d.]+)s \(([\d.]+) items/s\)")


def job_rate(texts_file: Path, dtype: str, job_flags: list[str]) -> float:
    """One `launch run-batch` over `texts_file`: its items/s."""
    with tempfile.TemporaryDirectory(prefix="run-batch-rate-") as folder:
        output = Path(folder) / "out.jsonl"
        done = subprocess.run(
            [sys.executable, "-m", "supervisor", "run-batch", "--input", str(texts_file), "--output", str(output),
             "--no-progress", "--dtype", dtype, "--device", "cpu", *job_flags],
            capture_output=True, text=True, check=True, timeout=1800,
        )  # fmt: skip
    match = SUMMARY.search(done.stderr)
    if match is None:
        raise RuntimeError(f"no summary line in run-batch's output:\n{done.stderr[-2000:]}")
    return float(match[3])


def offline_rate(texts: list[str], dtype: str) -> float:
    """sentence-transformers' encode over `texts`, batch 64, after one warm-up batch: items/s."""
    import torch
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(bundled_model_folder()), device="cpu")
    model.to(getattr(torch, dtype))
    model.encode(texts[:64], batch_size=64)
    started = time.perf_counter()
    model.encode(texts, batch_size=64)
    return len(texts) / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sentences", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    parser.add_argument("--job-flags", default="--api-server-count 1", help="run-batch's and launch's flags, quoted")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    texts = make_sentences(args.sentences, 0)
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="run-batch-rate-") as folder:
        texts_file = Path(folder) / "texts.jsonl"
        texts_file.write_text("".join(json.dumps({"text": text}) + "\n" for text in texts))
        for _ in range(args.rounds):
            for what in ("run-batch", "offline"):
                if what == "run-batch":
                    rate = job_rate(texts_file, args.dtype, shlex.split(args.job_flags))
                else:
                    rate = offline_rate(texts, args.dtype)
                runs.append({"what": what, "items_per_s": round(rate, 1)})
                print(json.dumps(runs[-1]), flush=True)
    means = {
        what: statistics.fmean(r["items_per_s"] for r in runs if r["what"] == what) for what in ("run-batch", "offline")
    }
    summary = {
        "means": {k: round(v, 1) for k, v in means.items()},
        "ratio": round(means["run-batch"] / means["offline"], 3),
    }
    print(json.dumps(summary), flush=True)
    if args.out:
        args.out.write_text(json.dumps({"command": sys.argv, "runs": runs, **summary}, indent=1) + "\n")


if __name__ == "__main__":
    main()
