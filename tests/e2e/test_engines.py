"""--engine-count 2 on the CPU: Sentence-Transformers' answers, work on both engines, a killed one costs nothing, and
a poison pill kills only its own engine (two restarts of it, the other serving throughout; case by case on fake
engines: tests/engine_client/). An engine that crash-loops beside another, taken out of service, on stub children
(tests/supervisor/test_arbiter.py)."""

from __future__ import annotations

import os
import re
import signal
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np
import numpy.typing as npt
import pytest
from sentence_transformers import SentenceTransformer

from bench.harness.models import remote_code_env
from bench.harness.scrape import scrape, value
from bench.harness.server_process import PoolserveProcess, wait_until
from bench.harness.steady_load import SteadyLoad
from tests.sentences import SENTENCES
from tests.utils import FLOAT32_CPU, engine_pids, pill_is_failed_and_its_neighbours_served, ready_line_time

MIN_COSINE = 0.9999


# The bundled model (the default, engines 0 and 1) and the fault tests' BERT that crashes its engine on a marker
# token (engines 2 and 3, one torch thread each), two engines each.
MODELS_TOML = """
[[models]]
engine_count = 2

[[models]]
model = "{faulty}"
served_model_name = ["faulty"]
trust_remote_code = true
engine_count = 2
torch_threads = 1
"""


@pytest.fixture(scope="module")
def two_engines(faulty_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[PoolserveProcess]:
    """Two engines for each of two models, from a --config file, behind 2 API servers: one launch for the tests of the
    bundled model and the poison pill's (each was a launch of --engine-count 2; a model's engines are its own)."""
    file = tmp_path_factory.mktemp("models") / "models.toml"
    file.write_text(MODELS_TOML.format(faulty=faulty_model))
    server = PoolserveProcess(
        "--config", str(file), "--api-server-count", "2", *FLOAT32_CPU, env=remote_code_env(faulty_model)
    ).wait_ready(180)
    try:
        yield server
    finally:
        server.stop()


def forward_passes(server: PoolserveProcess, engine: str) -> float:
    """How many forward passes the engine of this index has run, from /metrics' `engine` label."""
    return value(scrape(server.url), "poolserve_batch_inputs_count", engine=engine)


def test_two_engines_both_serve_and_answer_as_sentence_transformers(
    two_engines: PoolserveProcess, bundled_model: Path
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


def silent_engines(client: httpx.Client) -> list[int] | None:
    health = client.get("/health/ready")
    return health.json().get("silent_engines", []) if health.status_code == 200 else None  # [] is left out


def test_a_killed_engine_s_requests_move_to_the_other_and_it_comes_back(two_engines: PoolserveProcess) -> None:
    server = two_engines
    victim = engine_pids(server)["1"]
    body = {"input": [f"sentence number {i} about search and retrieval" for i in range(8)]}
    with SteadyLoad(server.url, clients=4, body=body) as load:
        load.wait_for(8)
        os.kill(victim, signal.SIGKILL)
        with server.client() as client:
            # Down, it is named in /health/ready while the other serves (restarting, as out of service).
            assert wait_until(lambda: silent_engines(client) == [1], 10), client.get("/health/ready").text
        ready_line_time(server, "engine-1", victim, timeout=60)
        before = forward_passes(server, "1")
        load.wait_for(sum(load.statuses.values()) + 8)
        # The restarted engine takes work again.
        assert wait_until(lambda: forward_passes(server, "1") > before, 10)
    assert load.failures == [], load.failures
    assert set(load.statuses) == {200}, load.statuses
    assert "lost engine 1; moving its" in server.stderr()


def test_with_two_engines_a_poison_pill_kills_only_its_own_engine_and_the_other_serves_throughout(
    two_engines: PoolserveProcess,
) -> None:
    """Blamed at its first crash (the API server reads the dead engine's flight record), the pill is never sent to
    the other engine: it waits for its own engine's restart, runs alone there, and the second crash fails it. The
    other engine never dies and answers a steady load all along; the requests sent beside the pill get their rows."""
    server = two_engines
    with SteadyLoad(server.url, clients=2, body={"input": "a steady request", "model": "faulty"}) as load:
        load.wait_for(10)
        mark = len(server.stderr())
        pill_is_failed_and_its_neighbours_served(server, model="faulty")
        served = sum(load.statuses.values())
        load.wait_for(served + 10)
    log = server.stderr()[mark:]
    killed = re.findall(r"(engine-\d) \(pid \d+\) was killed by SIGSEGV", log)
    assert len(killed) == 2 and len(set(killed)) == 1 and killed[0] in ("engine-2", "engine-3"), log
    assert "suspect(s) (in its forward pass) wait for its restart" in log, log
    assert load.failures == [] and set(load.statuses) == {200}, load.statuses
    print(f"steady load: {sum(load.statuses.values())} answered, slowest {max(load.latencies):.2f}s")
