"""The engine's own CPU per request, in one process and one thread: what the I/O thread and a step do, by part.

    python -m bench.engine_step_cpu --per-step 40 --rounds 5
    python -m bench.engine_step_cpu --per-step 40 --rounds 5 --overhead 50

The simulated GPU (bench.harness.models' `simgpu`, loaded through the real loader) serves `--per-step` one-sentence
requests a step, as the engine gets them: each encoded by the API server's codec, then decoded and admitted
(`EngineWire.decode`, `check_request`, the admission limit: the I/O thread's work), added to the core, batched
(`next_batch`), run (`run_batch`: padding, the pass, pooling, postprocessing, each answer's header) and encoded as
one answer message (`encode_outputs`). Printed: CPU microseconds per request of each part (the thread's own CPU
time, so the pass's sleep is left out), the minimum over `--rounds` rounds, which leaves most of a busy host's
noise out. No sockets and no second thread: their cost is what `bench.request_cpu` adds on top. `--overhead` fixes
the pass cost in tokens that the scheduler weighs padding against (what the engine refits from the passes it
serves; on a busy host it can fall under a window's padding, and the window is then cut). Run from a `git
worktree` of an earlier commit (the module copied in) to measure that commit.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import numpy as np

from bench.harness.models import model_folder
from engine_core.admission import AdmissionLimit
from engine_core.core import EngineCore
from engine_core.load_model import load_model
from engine_core.request_state import check_request
from poolserve.config import Config
from poolserve.protocol import Buffer, ClientWire, EngineRequest, EngineWire

PARTS = ("admit", "add", "next_batch", "run_batch", "encode")


def sentences(count: int, seed: int = 0) -> list[list[Buffer]]:
    """`count` one-sentence requests of 10-23 tokens (bench.workloads' short sentences), as their frames arrive."""
    rng = np.random.default_rng(seed)
    wire = ClientWire()
    messages: list[list[Buffer]] = []
    for request_id in range(count):
        middle = rng.integers(1000, 20000, int(rng.integers(8, 22))).tolist()
        request = EngineRequest.from_rows([[101, *middle, 102]])
        request.id = request_id
        messages.append([bytes(frame) for frame in wire.encode(request)])
    return messages


def one_round(core: EngineCore, messages: list[list[Buffer]], per_step: int) -> dict[str, float]:
    """CPU seconds per request of each part, over every step of `messages`."""
    wire = EngineWire()
    spent = dict.fromkeys(PARTS, 0.0)
    clock = time.thread_time
    for start in range(0, len(messages), per_step):
        began = clock()
        admitted = []
        for frames in messages[start : start + per_step]:
            msg = wire.decode(frames)
            assert isinstance(msg, EngineRequest)
            request = check_request(b"api-0", msg, core.card)
            assert core.admission.try_admit(request.count, request.total_cost)
            admitted.append(request)
        admitted_at = clock()
        for request in admitted:
            core.add(request)
        added = clock()
        parts = [("admit", admitted_at - began), ("add", added - admitted_at)]
        while (batch := core.next_batch()) is not None:
            planned = clock()
            step = core.run_batch(batch)
            ran = clock()
            for identity in step.servers:
                wire.encode_outputs(step.outputs.get(identity, []), step.failures.get(identity, []))
            parts += [("next_batch", planned - added), ("run_batch", ran - planned), ("encode", clock() - ran)]
            added = clock()
        for part, seconds in parts:
            spent[part] += seconds
    return {part: seconds / len(messages) for part, seconds in spent.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--per-step", type=int, default=40, help="requests that arrive between two steps")
    parser.add_argument("--steps", type=int, default=100, help="steps a round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument(
        "--overhead", type=float, default=None, help="the pass cost in tokens, fixed (default: as loaded)"
    )
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    config = Config(
        model=str(model_folder("simgpu")), device="cpu", dtype="float32", trust_remote_code=True,
        max_batch_size=256, max_batch_tokens=32768, torch_threads=1,
    )  # fmt: skip
    core = EngineCore(load_model(config), AdmissionLimit(max_inputs=1 << 30, max_tokens=1 << 40))
    if args.overhead is not None:
        core.scheduler.batch_overhead_tokens = args.overhead
        core.pass_cost.cap = args.overhead  # a refit answers within 0..cap: fixed where it would wander
        core.pass_cost.observe = lambda tokens, seconds: None  # type: ignore[method-assign]
    messages = sentences(args.per_step * args.steps)
    rounds = [one_round(core, messages, args.per_step) for _ in range(args.rounds + 1)][1:]  # the first warms up
    best = {part: min(r[part] for r in rounds) for part in PARTS}
    row = {
        "per_step": args.per_step,
        "overhead": core.scheduler.batch_overhead_tokens,
        "us_per_request": {part: round(seconds * 1e6, 2) for part, seconds in best.items()},
        "total_us": round(min(sum(r.values()) for r in rounds) * 1e6, 2),
    }
    print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
