"""CPU of the wire alone, per request: one-sentence requests across a real ZeroMQ ipc pair and their answers back.

    python -m bench.wire_cpu --per-turn 1,8,40 --rounds 7

In one process, without the model, the API server's side and the engine's side of the wire do what they do for
`--per-turn` requests made in one event-loop turn: the client encodes and sends them (one message each before
issue 28's batched wire, one `Submit` after), the engine receives and decodes them; the engine encodes one step's
answers for them (one `Outputs`, a frame per answer before, one frame of rows after) and sends it, and the client
receives it and cuts its rows. Printed: microseconds per request each way, the minimum over `--rounds` rounds of
`--requests` requests, so that a busy host's noise is left out. Run from a `git worktree` of an earlier commit
(the module copied in) to measure that commit's wire: both layouts are read by what the codecs offer.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from functools import partial
from typing import Any

import numpy as np
import zmq

from poolserve import protocol
from poolserve.protocol import ClientWire, EngineRequest, EngineWire, PooledOutput, decode_rows

# A one-sentence request as bench.harness.workloads' `short` sends it: ~16 tokens.
TOKENS = [101, *range(2000, 2014), 102]
DIM = 384


def make_requests(count: int, first_id: int) -> list[EngineRequest]:
    requests = [EngineRequest.from_rows([TOKENS]) for _ in range(count)]
    for offset, request in enumerate(requests):
        request.id = first_id + offset
    return requests


def timed(rounds: int, run: Callable[[], int]) -> float:
    """The minimum over rounds of the seconds per request `run` reports it handled."""
    best = float("inf")
    for _ in range(rounds):
        started = time.perf_counter()
        handled = run()
        best = min(best, (time.perf_counter() - started) / handled)
    return best


class Pair:
    """Both ends of the wire in one process: an API server's DEALER and codec, an engine's ROUTER and codec."""

    def __init__(self) -> None:
        self.batched = hasattr(ClientWire, "encode_submit")
        self.context = zmq.Context()
        self.router = self.context.socket(zmq.ROUTER)
        self.router.setsockopt(zmq.SNDHWM, 0)
        self.router.bind("inproc://wire-cpu")
        self.dealer = self.context.socket(zmq.DEALER)
        self.dealer.setsockopt(zmq.IDENTITY, b"api-0")
        self.dealer.setsockopt(zmq.SNDHWM, 0)
        self.dealer.connect("inproc://wire-cpu")
        self.client, self.engine = ClientWire(), EngineWire()
        self.rows = np.random.default_rng(0).random((1, DIM), dtype=np.float32)

    def to_engine(self, turns: list[list[EngineRequest]]) -> int:
        """Each turn's requests sent and read by the engine; how many."""
        count = sum(map(len, turns))
        for requests in turns:
            if self.batched:
                self.dealer.send_multipart(self.client.encode_submit(requests), copy=False)
            else:
                for request in requests:
                    self.dealer.send_multipart(self.client.encode(request), copy=False)  # type: ignore[arg-type]
        received = 0
        while received < count:
            msg: Any = self.engine.decode(self.router.recv_multipart()[1:])
            received += len(msg.requests) if self.batched else 1
        return count

    def to_client(self, turns: list[list[EngineRequest]]) -> int:
        """Each turn's answers as one step's message, read and cut by the client; how many."""
        for requests in turns:
            outputs = [(PooledOutput(request.id, 1, DIM, 0.001, 0.004), self.rows) for request in requests]
            self.router.send_multipart([b"api-0", *self.engine.encode_outputs(outputs)], copy=False)
        for _ in turns:
            frames = self.dealer.recv_multipart()
            msg = self.client.decode(frames)
            assert isinstance(msg, protocol.Outputs)
            decode_rows(msg, frames[1:])
        return sum(map(len, turns))

    def close(self) -> None:
        self.dealer.close()
        self.router.close()
        self.context.term()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--per-turn", default="1,8,40", help="requests made in one event-loop turn, comma-separated")
    parser.add_argument("--requests", type=int, default=4000, help="requests a round")
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    pair = Pair()
    for per_turn in map(int, args.per_turn.split(",")):
        turns = [make_requests(per_turn, turn * per_turn) for turn in range(max(1, args.requests // per_turn))]
        row = {
            "batched_wire": pair.batched,
            "per_turn": per_turn,
            "to_engine_us": round(timed(args.rounds, partial(pair.to_engine, turns)) * 1e6, 2),
            "to_client_us": round(timed(args.rounds, partial(pair.to_client, turns)) * 1e6, 2),
        }
        print(json.dumps(row), flush=True)
    pair.close()


if __name__ == "__main__":
    main()
