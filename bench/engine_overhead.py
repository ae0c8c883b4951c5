"""The engine's own work around the forward pass: what overlapping the next batch's assembly could save.

    python -m bench.engine_overhead [--device cpu] [--sentences 512] [--per-request 16] [--rounds 2]
    python -m bench.engine_overhead --no-model --gpu-caps --sentences 2048 --per-request 1 --rounds 9

Drives EngineCore in process (the server's scheduler, batch cutting, padding, postprocessing; no
sockets; each request checked as the engine checks it on arrival) over corpus sentences sent as
requests of `--per-request`, and splits each round's time
into the model runner's calls (padding and host-to-device copies included, as the runner does
them) and everything else the engine's step does. The second share is the most that assembling
the next batch during the forward pass could hide. Also counted: the share of the tokens computed
that are padding, after the scheduler's length-sorted cutting (what token packing could save; with
`--token-packing off`, since with it on, the CPU's default, only attention computes the padding).
docs/benchmarks.md, "CPU engine", holds the figures.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import random
import time
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from bench.harness.corpus import make_sentence


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--sentences", type=int, default=512)
    parser.add_argument("--per-request", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument(
        "--token-packing",
        default="auto",
        choices=["auto", "on", "off"],
        help="The engine's --token-packing. Packed, the padding counted is attention's only (the CPU default).",
    )
    parser.add_argument(
        "--gpu-caps",
        action="store_true",
        help="Schedule as the engine does on a GPU (batches of up to 256 inputs and 32,768 tokens, a pass "
        "worth a whole batch), on whatever device runs the model.",
    )
    parser.add_argument(
        "--no-model",
        action="store_true",
        help="The runner answers rows of the model's width at once: what is timed is the engine's own "
        "host work per input (reported in thread CPU time, steadier than the clock on a busy machine).",
    )
    parser.add_argument(
        "--overhead-tokens",
        type=float,
        help="Fix the scheduler's per-pass cost, in tokens (default: measured at start-up, as the engine does; "
        "on a busy machine that measure varies, and the batches with it).",
    )
    args = parser.parse_args()

    import torch
    from tokenizers import Tokenizer

    from engine_core.admission import AdmissionLimit
    from engine_core.core import EngineCore
    from engine_core.load_model import load_model
    from engine_core.request_state import check_request
    from poolserve.config import Config
    from poolserve.protocol import EngineRequest

    caps = {"max_batch_size": 256, "max_batch_tokens": 32768} if args.gpu_caps else {}
    loaded = load_model(Config(device=args.device, api_server_count=1, token_packing=args.token_packing, **caps))  # type: ignore[arg-type]
    if args.gpu_caps or args.overhead_tokens is not None:
        overhead = args.overhead_tokens if args.overhead_tokens is not None else 32768.0
        loaded = dataclasses.replace(loaded, batch_overhead_tokens=overhead)
    if args.no_model:
        width = loaded.card.output_size
        answer = np.random.default_rng(0).random((loaded.card.max_batch_size, width), dtype=np.float32)
        setattr(loaded.runner, "run_texts", lambda batch, types: answer[: len(batch)].copy())  # noqa: B010
    backend = Tokenizer.from_str(loaded.card.tokenizer_json)
    rng = random.Random(0)
    rows = [backend.encode(make_sentence(rng)).ids for _ in range(args.sentences)]
    core = EngineCore(loaded, AdmissionLimit(max_inputs=10**6, max_tokens=10**9))
    if args.no_model or args.overhead_tokens is not None:
        # The pass cost this run states stays: a runner that answers at once would refit it to the cap.
        core.pass_cost.observe = lambda tokens, seconds: None  # type: ignore[method-assign]
    run_texts = core.runner.run_texts
    in_runner = [0.0]
    tokens = [0, 0]  # real, and computed (padding included)

    def timed(
        batch: Sequence[npt.NDArray[np.int32]], types: Sequence[npt.NDArray[np.int32]] | None
    ) -> npt.NDArray[np.float32]:
        lengths = [len(row) for row in batch]
        tokens[0] += sum(lengths)
        tokens[1] += len(lengths) * max(lengths)
        started = time.perf_counter()
        try:
            return run_texts(batch, types)
        finally:
            in_runner[0] += time.perf_counter() - started

    setattr(core.runner, "run_texts", timed)  # noqa: B010 (a method of an instance, replaced for timing)
    report: list[dict[str, object]] = []
    for round_index in range(args.rounds):
        in_runner[0] = 0.0
        tokens[:] = [0, 0]
        jobs = [
            (i, EngineRequest.from_rows(rows[i : i + args.per_request])) for i in range(0, len(rows), args.per_request)
        ]
        started, cpu_started = time.perf_counter(), time.thread_time()  # the engine's part from here
        for i, job in jobs:
            job.id = round_index * 10**6 + i
            request = check_request(b"bench", job, core.card)
            assert core.admission.try_admit(request.count, request.total_cost)
            core.add(request)
        steps = 0
        while (batch := core.next_batch()) is not None:
            core.run_batch(batch)
            steps += 1
        total, cpu = time.perf_counter() - started, time.thread_time() - cpu_started
        report.append({"round": round_index, "steps": steps, "total_s": round(total, 3),
                       "runner_s": round(in_runner[0], 3),
                       "outside_runner_share": round((total - in_runner[0]) / total, 4),
                       "padding_share": round(1 - tokens[0] / tokens[1], 4),
                       "cpu_us_per_input": round(cpu / len(rows) * 1e6, 1)})  # fmt: skip
    print(json.dumps({"device": args.device, "torch_threads": torch.get_num_threads(), "rounds": report}, indent=1))


if __name__ == "__main__":
    main()
