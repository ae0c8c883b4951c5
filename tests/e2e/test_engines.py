"""--engine-count 2 on the CPU: Sentence-Transformers' answers, work on both engines, a killed one costs nothing.

A poison pill across two engines is tested in tests/e2e/test_faults.py (two restarts of the engine it
kills, the other serving throughout) and, case by case, on fake engines (tests/engine_client/)."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pytest
from sentence_transformers import SentenceTransformer

from bench.scrape import scrape, value
from bench.server_process import wait_until
from bench.steady_load import SteadyLoad
from tests.sentences import SENTENCES
from tests.utils import FLOAT32_CPU, LaunchedServer, crash_loop, engine_pids, ready_line_time

MIN_COSINE = 0.9999


@pytest.fixture(scope="module")
def two_engines() -> Iterator[LaunchedServer]:
    server = LaunchedServer("--api-server-count", "2", "--engine-count", "2", *FLOAT32_CPU).wait_ready()
    try:
        yield server
    finally:
        server.stop()


def forward_passes(server: LaunchedServer, engine: str) -> float:
    """How many forward passes the engine of this index has run, from /metrics' `engine` label."""
    return value(scrape(server.url), "poolserve_batch_inputs_count", engine=engine)


def test_two_engines_both_serve_and_answer_as_sentence_transformers(
    two_engines: LaunchedServer, bundled_model: Path
) -> None:
    want = SentenceTransformer(str(bundled_model), device="cpu").encode(SENTENCES[:24], convert_to_numpy=True)

    def one(sentence: str) -> npt.NDArray[np.float32]:
        with two_engines.client() as client:
            response = client.post("/v1/embeddings", json={"input": [sentence]})
        assert response.status_code == 200, response.text
        return np.asarray(response.json()["data"][0]["embedding"], dtype=np.float32)

    with ThreadPoolExecutor(8) as pool:
        got = np.stack(list(pool.map(one, SENTENCES[:24])))
    cosine = (got * want).sum(axis=1) / np.linalg.norm(got, axis=1) / np.linalg.norm(want, axis=1)
    assert cosine.min() >= MIN_COSINE, f"lowest cosine {cosine.min()} at sentence {cosine.argmin()}"
    assert forward_passes(two_engines, "0") > 0 and forward_passes(two_engines, "1") > 0


def test_a_killed_engine_s_requests_move_to_the_other_and_it_comes_back(two_engines: LaunchedServer) -> None:
    server = two_engines
    victim = engine_pids(server)["1"]
    body = {"input": [f"sentence number {i} about search and retrieval" for i in range(8)]}
    with SteadyLoad(server.url, clients=4, body=body) as load:
        load.wait_for(8)
        os.kill(victim, signal.SIGKILL)
        ready_line_time(server, "engine-1", victim, timeout=60)
        before = forward_passes(server, "1")
        load.wait_for(sum(load.statuses.values()) + 8)
        # The restarted engine takes work again.
        assert wait_until(lambda: forward_passes(server, "1") > before, 10)
    assert load.failures == [], load.failures
    assert set(load.statuses) == {200}, load.statuses
    assert "lost engine 1; moving its" in server.stderr()


def test_an_engine_that_crashes_again_and_again_is_taken_out_of_service_while_the_other_serves(
    two_engines: LaunchedServer,
) -> None:
    """More crashes than the crash history allows, in one engine of two: that engine alone stops (named in the
    log, /health/ready and the metrics) and the other serves on, where the whole server used to give up and
    exit. Last in this module: engine-1 stays out of service for minutes."""
    server = two_engines
    survivor = engine_pids(server)["0"]
    body = {"input": ["a sentence while one engine crash-loops"]}
    with SteadyLoad(server.url, clients=2, body=body) as load:
        # The crash history allows 5 within 60 s (the test above killed it once already).
        crash_loop(server, survivor)
        done = sum(load.statuses.values())
        load.wait_for(done + 10)
    assert server.proc.poll() is None, server.log()
    assert load.failures == [] and set(load.statuses) == {200}, (load.failures, load.statuses)
    assert "1" not in engine_pids(server) and "0" in engine_pids(server)
    with server.client() as client:
        health = client.get("/health/ready")
        assert health.status_code == 200 and health.json()["silent_engines"] == [1], health.text
    assert value(scrape(server.url), "poolserve_engine_out_of_service", engine="engine-1") == 1
