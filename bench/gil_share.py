"""What a Python thread beside a launch-bound pass costs the pass: the engine's I/O thread against a GPU pass, on a CPU.

    python -m bench.gil_share [--ops 300] [--passes 200]

On CUDA a forward pass is hundreds of op calls, each one taking the GIL for its Python side and dropping it while
the op is dispatched; the engine's I/O thread decodes requests in Python beside it. Here a "pass" is `--ops` in-place
adds on a small tensor (each drops and retakes the GIL as a CUDA launch does), timed alone and beside a thread that
decodes msgpack in bursts for a given share of each 2 ms and sleeps the rest, under three switch intervals. If the
pass lost the interpreter for whole switch intervals (5 ms), its time would jump; if it loses only what the other
thread runs, its time grows by about that share. Prints one line per setting.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time

import msgspec
import torch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", type=int, default=300)
    parser.add_argument("--passes", type=int, default=200)
    args = parser.parse_args()
    torch.set_num_threads(1)
    state = torch.zeros(384)
    payload = msgspec.msgpack.encode({"ids": list(range(60)), "n": 1, "text": "x" * 50})
    decoder = msgspec.msgpack.Decoder()
    stop = threading.Event()

    def one_pass() -> float:
        started = time.perf_counter()
        for _ in range(args.ops):
            state.add_(1.0)
        return time.perf_counter() - started

    def io_thread(share: float) -> None:
        while not stop.is_set():
            started = time.perf_counter()
            while time.perf_counter() - started < 0.002 * share:
                for _ in range(20):
                    decoder.decode(payload)
            time.sleep(0.002 * (1 - share))

    for interval in (0.005, 0.0005, 0.0001):
        sys.setswitchinterval(interval)
        for share in (0.0, 0.3, 0.6):
            stop.clear()
            thread = threading.Thread(target=io_thread, args=(share,), daemon=True) if share else None
            if thread:
                thread.start()
            times = [one_pass() for _ in range(args.passes)]
            stop.set()
            if thread:
                thread.join()
            print(
                f"switch interval {interval * 1e6:5.0f} µs, other thread busy {share:.0%}: pass p50 "
                f"{statistics.median(times) * 1e3:.2f} ms, mean {statistics.fmean(times) * 1e3:.2f} ms",
                flush=True,
            )


if __name__ == "__main__":
    main()
