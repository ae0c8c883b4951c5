"""CPU of one step's answers on the wire, per answer: the engine's encode and send, the API server's receive and cut.

    python -m bench.answers_cpu --per-step 1,8,40,128 --rounds 7

In one process, without the model: the engine encodes what one step finished for an API server (`--per-step`
one-sentence answers of 384 float32 values, `EngineWire.encode_outputs`) and sends it as its I/O thread does
(`send_frames`) over a ZeroMQ pair; the API server's side receives it, decodes the header and cuts each answer's
rows (`decode_rows`). Printed: microseconds per answer for the engine's side and the API server's side apart, the
minimum over `--rounds` rounds, so that a busy host's noise is left out. Run from a `git worktree` of an earlier
commit (the module copied in) to measure that commit's layout: both read only what the codecs offer.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable

import numpy as np
import zmq

from engine_core.io_thread import send_frames
from poolserve.protocol import ClientWire, EngineWire, Frame, Outputs, PooledOutput, decode_rows

DIM = 384


def timed(rounds: int, run: Callable[[], float]) -> float:
    """The minimum over rounds of the seconds per answer `run` reports."""
    return min(run() for _ in range(rounds))


class Pair:
    """Both ends in one process: the engine's ROUTER and codec, an API server's DEALER and codec."""

    def __init__(self) -> None:
        self.context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        self.router = self.context.socket(zmq.ROUTER)
        self.router.setsockopt(zmq.SNDHWM, 0)
        self.router.bind("inproc://answers-cpu")
        self.dealer = self.context.socket(zmq.DEALER)
        self.dealer.setsockopt(zmq.IDENTITY, b"api-0")
        self.dealer.setsockopt(zmq.RCVHWM, 0)
        self.dealer.connect("inproc://answers-cpu")
        self.dealer.send(b"hello")  # the ROUTER learns the identity
        self.router.recv_multipart()
        self.client, self.engine = ClientWire(), EngineWire()
        # A step's normalized rows, each answer a one-row view of them, as the engine's postprocessing cuts them.
        self.stacked = np.random.default_rng(0).random((512, DIM), dtype=np.float32)

    def round(self, per_step: int, steps: int) -> tuple[float, float]:
        """Seconds per answer on the engine's side, then on the API server's side, over `steps` steps."""
        started = time.process_time()
        for step in range(steps):
            outputs = [
                (PooledOutput(step * per_step + i, 1, DIM, 0.001, 0.004), self.stacked[i : i + 1])
                for i in range(per_step)
            ]
            frames: list[Frame] = [b"api-0", *self.engine.encode_outputs(outputs)]
            send_frames(self.router, frames)
        sent = time.process_time()
        for _ in range(steps):
            received = self.dealer.recv_multipart()
            msg = self.client.decode(received)
            assert isinstance(msg, Outputs)
            decode_rows(msg, received[1:])
        done = time.process_time()
        answers = per_step * steps
        return (sent - started) / answers, (done - sent) / answers

    def close(self) -> None:
        self.dealer.close()
        self.router.close()
        self.context.term()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--per-step", default="1,8,40,128", help="answers a step finishes, comma-separated")
    parser.add_argument("--answers", type=int, default=4000, help="answers a round")
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    pair = Pair()
    for per_step in map(int, args.per_step.split(",")):
        steps = max(1, args.answers // per_step)
        rounds = [pair.round(per_step, steps) for _ in range(args.rounds)]
        row = {
            "per_step": per_step,
            "engine_us": round(min(engine for engine, _ in rounds) * 1e6, 2),
            "api_server_us": round(min(client for _, client in rounds) * 1e6, 2),
        }
        print(json.dumps(row), flush=True)
    pair.close()


if __name__ == "__main__":
    main()
