"""ONNX Runtime's spin-waiting and a pass of the graph: whether a session's threads should spin within a pass.

    python -m bench.graph_spin [--inputs 1,2,16] [--passes 200] [--rounds 2]

The engine's graph sessions (engine_core/onnx_runtime.py) must not spin between passes: a spinning thread holds a
core for ~65 ms after each MiniLM pass, which the API servers and torch's next pass need. ONNX Runtime offers two
ways to stop it: `session.intra_op.allow_spinning` 0 (the threads never spin: each operator's parallel work wakes a
sleeping thread) and `session.force_spinning_stop` 1 (they spin within a run and stop as the last run returns).
This loads the bundled model's packed graph as `--runtime onnxruntime` caches it, and times passes of `--inputs`
bench corpus sentences on a session of every thread in three modes: `never` (allow_spinning 0), `within`
(force_spinning_stop 1) and `always` (ONNX Runtime's default), each in a process of its own (a spinning session's
threads would take the others' cores), the modes alternated per round, with 3 ms between passes as served. Printed:
each run's median, p10 and p90 ms a pass, and each mode's median over the rounds.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import time

MODES = {
    "never": {"session.intra_op.allow_spinning": "0"},
    "within": {"session.force_spinning_stop": "1"},
    "always": {},
}
GAP_S = 0.003


def time_passes(mode: str, inputs: int, passes: int) -> dict[str, object]:
    """In this process: `passes` passes of `inputs` sentences through the cached packed graph in `mode`."""
    import numpy as np
    import onnxruntime
    import torch
    from tokenizers import Tokenizer

    from bench.harness.corpus import make_sentence
    from bench.harness.models import bundled_model_folder
    from engine_core.load_model import load_model
    from engine_core.packed_graph import pack_rows, packed_feed
    from poolserve.config import Config

    model = load_model(Config(device="cpu", dtype="float32", runtime="onnxruntime"))
    path = model.runner.model.path  # type: ignore[attr-defined]
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = torch.get_num_threads()
    options.inter_op_num_threads = 1
    for key, value in MODES[mode].items():
        options.add_session_config_entry(key, value)
    session = onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    del model
    names = [node.name for node in session.get_inputs()]
    tokenizer = Tokenizer.from_file(str(bundled_model_folder() / "tokenizer.json"))
    tokenizer.no_padding()
    tokenizer.no_truncation()
    rng = random.Random(0)
    feeds = []
    for _ in range(passes):
        ids = [tokenizer.encode(make_sentence(rng)).ids for _ in range(inputs)]
        padded = np.zeros((inputs, max(map(len, ids))), dtype=np.int64)
        for row, sentence in enumerate(ids):
            padded[row, : len(sentence)] = sentence
        feed = packed_feed(pack_rows((padded > 0).sum(axis=1)), padded, None)
        feeds.append({name: feed[name] for name in names})
    for feed in feeds[:5]:
        session.run(["last_hidden_state"], feed)
    seconds = []
    for feed in feeds:
        started = time.perf_counter()
        session.run(["last_hidden_state"], feed)
        seconds.append(time.perf_counter() - started)
        time.sleep(GAP_S)
    ms = sorted(1000 * s for s in seconds)
    return {"mode": mode, "inputs": inputs, "median_ms": round(statistics.median(ms), 2),
            "p10_ms": round(ms[len(ms) // 10], 2), "p90_ms": round(ms[9 * len(ms) // 10], 2)}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--inputs", default="1,2,16")
    parser.add_argument("--passes", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--one", nargs=2, metavar=("MODE", "INPUTS"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(time_passes(args.one[0], int(args.one[1]), args.passes)), flush=True)
        return
    medians: dict[tuple[int, str], list[float]] = {}
    for inputs in (int(n) for n in args.inputs.split(",")):
        for round_ in range(args.rounds):
            order = list(MODES) if round_ % 2 == 0 else list(MODES)[::-1]
            for mode in order:
                argv = [sys.executable, "-m", "bench.graph_spin", "--passes", str(args.passes), "--one", mode,
                        str(inputs)]  # fmt: skip
                done = subprocess.run(argv, capture_output=True, text=True, check=True)
                row = json.loads(done.stdout.splitlines()[-1])
                print(json.dumps({"round": round_, **row}), flush=True)
                medians.setdefault((inputs, mode), []).append(float(row["median_ms"]))
    summary = {f"{inputs} inputs, {mode}": round(statistics.median(v), 2) for (inputs, mode), v in medians.items()}
    print(json.dumps({"median_ms": summary}), flush=True)


if __name__ == "__main__":
    main()
