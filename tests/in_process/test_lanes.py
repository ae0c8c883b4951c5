"""Two passes at once on a CPU (engine_core/engine.py's second lane), in a server started in this process: with more
queued than one pass takes, two passes run at the same time on one torch thread each, and every answer is the one the
model gives each text alone; a lone request's pass has every thread. The forward passes are watched from outside
(EngineCore.forward wrapped by the test)."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from types import SimpleNamespace
from typing import cast

import numpy as np
import pytest
import torch

from bench.harness.corpus import make_sentence
from engine_core.core import EngineCore, StartedPass
from engine_core.engine import (
    BEAT_INTERVAL_S,
    COHORT_HOLD_MOST_S,
    COHORT_HOLD_S,
    COHORT_HOLD_SHARE,
    COHORT_MOST,
    beat_is_due,
    cohort_hold,
    hold_limit,
    pair_on_lanes,
)
from engine_core.scheduler import WorkItem
from poolserve.config import usable_cores
from tests.in_process.stack_server import InProcessServer, served
from tests.utils import FLOAT32_CPU

MODEL = "sentence-transformers/all-MiniLM-L6-v2"


@dataclass(frozen=True)
class Pass:
    thread: int
    threads: int  # the torch threads it ran on
    started: float
    ended: float
    inputs: int


@pytest.fixture(scope="module")
def watched() -> Iterator[tuple[InProcessServer, list[Pass]]]:
    if usable_cores() < 2:
        pytest.skip("two passes at once need two torch threads (a CPU of one core gives one)")
    # Two threads whatever an earlier test of this process left (a core's run_batch sets one for a small batch): the
    # engine reads them at load, and its thread takes them as its first use of torch.
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    passes: list[Pass] = []
    original = EngineCore.forward

    def forward(self: EngineCore, started: StartedPass) -> object:
        began = time.monotonic()
        rows = original(self, started)
        passes.append(Pass(threading.get_ident(), torch.get_num_threads(), began, time.monotonic(), len(started.batch)))
        return rows

    EngineCore.forward = forward  # type: ignore[method-assign]
    try:
        # batches of at most 8 inputs: a request of 48 leaves work queued behind every pass but the last
        with served("--max-batch-size", "8", *FLOAT32_CPU) as server:
            yield server, passes
    finally:
        EngineCore.forward = original  # type: ignore[method-assign]
        torch.set_num_threads(before)


def embed(server: InProcessServer, texts: list[str]) -> np.ndarray:
    with server.client() as client:
        response = client.post("/v1/embeddings", json={"model": MODEL, "input": texts})
    assert response.status_code == 200, response.text
    return np.array([row["embedding"] for row in response.json()["data"]], dtype=np.float32)


def test_queued_work_runs_two_passes_at_once_each_on_one_thread(watched: tuple[InProcessServer, list[Pass]]) -> None:
    server, passes = watched
    rng = random.Random(7)
    texts = [make_sentence(rng) for _ in range(48)]
    passes.clear()
    together = embed(server, texts)
    ran = list(passes)
    assert sum(p.inputs for p in ran) == 48
    overlapping = [
        (a, b) for a in ran for b in ran if a.thread != b.thread and a.started < b.ended and b.started < a.ended
    ]
    assert overlapping, f"no two passes overlapped: {ran}"
    assert all(a.threads == 1 and b.threads == 1 for a, b in overlapping)
    # each answer is the model's for that text alone (one request at a time: a lone pass)
    alone = np.concatenate([embed(server, [text]) for text in texts])
    np.testing.assert_allclose(together, alone, atol=2e-5)


def test_a_lone_request_has_every_thread(watched: tuple[InProcessServer, list[Pass]]) -> None:
    server, passes = watched
    passes.clear()
    embed(server, ["one sentence, alone in the engine"])
    assert [(p.inputs, p.threads) for p in passes] == [(1, 2)]


def test_a_lone_request_of_a_pair_runs_on_one_thread_where_the_runner_pairs_on_lanes() -> None:
    """The rule tests/e2e/test_two_clients.py shows served (LoadedModel.pairs_on_lanes: ONNX Runtime's graph)."""

    def batch(priority: int) -> list[WorkItem]:
        return [cast(WorkItem, SimpleNamespace(request=SimpleNamespace(priority=priority)))]

    assert pair_on_lanes(2, batch(0))
    assert not pair_on_lanes(1, batch(0))  # one client: every thread
    assert not pair_on_lanes(3, batch(0))  # three or four: held for one pass (engine.py's cohort hold)
    assert not pair_on_lanes(2, batch(0) * 2)  # both there already: one pass
    assert not pair_on_lanes(2, batch(-1))  # urgent: every thread


def test_a_pass_that_never_returns_stops_the_beats_in_either_lane() -> None:
    last = 100.0
    assert beat_is_due(last + BEAT_INTERVAL_S, last, [])
    assert not beat_is_due(last + BEAT_INTERVAL_S / 2, last, [])
    # the second lane's pass started after the last beat: the main loop beats on
    assert beat_is_due(last + BEAT_INTERVAL_S, last, [last + 0.1])
    # it has run since before the last beat: no beat until it ends
    assert not beat_is_due(last + 5 * BEAT_INTERVAL_S, last, [last - 0.1])


def test_a_pass_waits_briefly_for_the_rest_of_a_small_cohort_and_never_for_one_client() -> None:
    end, limit = 50.0, 0.004
    until = end + limit
    # one client: its cohort is its own request
    assert cohort_hold(1, 1, until, end) == 0.0
    # two clients: one waited behind the last pass, the other's next request is on its way
    assert cohort_hold(2, 1, until, end + 0.001) == pytest.approx(limit - 0.001)
    assert cohort_hold(2, 1, until, end + limit + 0.001) == 0.0  # not past the hold
    assert cohort_hold(2, 2, until, end) == 0.0  # all there
    assert cohort_hold(2, 0, until, end) == 0.0  # nothing to run yet: the engine just waits for work
    # a large cohort (32 clients) waits only for COHORT_MOST
    assert cohort_hold(32, COHORT_MOST - 1, until, end) == pytest.approx(limit)
    assert cohort_hold(32, COHORT_MOST, until, end) == 0.0


def test_the_hold_is_a_share_of_the_last_pass_within_its_bounds() -> None:
    # a fast host's lone pass (5 ms): the floor, a client's round trip there
    assert hold_limit(0.005) == COHORT_HOLD_S
    # a slower host's (20 ms): its clients' round trips are longer too
    assert hold_limit(0.020) == pytest.approx(COHORT_HOLD_SHARE * 0.020)
    assert COHORT_HOLD_S < hold_limit(0.020) < COHORT_HOLD_MOST_S
    # a large model's (200 ms): no longer than the ceiling
    assert hold_limit(0.200) == COHORT_HOLD_MOST_S
    assert hold_limit(0.0) == COHORT_HOLD_S
