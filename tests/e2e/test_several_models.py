"""Several models behind one `launch`: the bundled MiniLM, a tiny cross-encoder and a tiny CLIP, each with its own
engine, declared in a --config file that gives each its own queue limit, cache and priority setting; each request
routed by its `model` field; the answers are the one-model servers' own, each model's figures are apart on /metrics,
and one model's engine crash, or a poison pill to a fourth model (the fault tests' faulty BERT), costs the others
nothing; CLIP's thin and wide images cost the API server no memory (its own VmRSS and VmHWM, which the test's process,
holding every model of the suite, cannot show). The one-model servers the answers are held to: the session's `launch`
of MiniLM, and the cross-encoder and CLIP served in this process (tests/in_process/stack_server.py: the same engine
and API server code, without a `launch` each). A model whose only engine crash-loops, taken out of service while the
others serve, is the supervisor's decision: tests/supervisor/test_arbiter.py, on stub children; which GPU each
model's engines get, tests/supervisor/test_gpu_placement.py. Everything else of the CLIP model:
tests/in_process/test_clip.py.

The same launch serves two models with two engines each (`--engine-count 2` as a model's `engine_count`): the
bundled model again as minilm-pair, whose engines both answer as Sentence-Transformers, one killed costing nothing,
and the faulty BERT again as faulty-pair, where a poison pill kills only its own engine (two restarts of it, the
other serving throughout; case by case on fake engines: tests/engine_client/). An engine that crash-loops beside
another, taken out of service: tests/supervisor/test_arbiter.py, on stub children."""

from __future__ import annotations

import os
import random
import re
import signal
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import numpy.typing as npt
import pytest
from PIL import Image
from sentence_transformers import SentenceTransformer

from bench.harness.models import remote_code_env
from bench.harness.scrape import scrape, value
from bench.harness.server_process import PoolserveProcess, wait_until
from bench.harness.stats import percentile
from bench.harness.steady_load import SteadyLoad
from bench.poison_isolation import finished_during, send_pill
from tests.fidelity.image_text_layouts import ClipReference
from tests.images import data_url, encode, make_image
from tests.in_process.stack_server import InProcessServer, served_folder
from tests.sentences import SENTENCES
from tests.utils import (
    FLOAT32_CPU,
    api_server_pids,
    engine_pids,
    pill_is_failed_and_its_neighbours_served,
    ready_line_time,
)

QUERY = "what is the capital of france?"
MODELS = ("minilm", "rerank", "clip")
# Every model the launch serves, in the order declared: engines 0 (minilm), 1 (rerank), 2 (clip), 3 (faulty), 4 and 5
# (minilm-pair), 6 and 7 (faulty-pair).
SERVED = (*MODELS, "faulty", "minilm-pair", "faulty-pair")
DOCUMENTS = [
    "Paris is the capital and most populous city of France.",
    "Berlin is the capital of Germany.",
    "Croissants are a French pastry.",
]


# The models' own settings: rerank's queue holds 6 inputs and a cache of about 8 rows; clip lets no request jump its
# queue (min_priority 0); minilm's cache is 1 MiB; faulty (the fault tests' BERT that crashes its engine on a marker
# token) runs its own code; minilm-pair and faulty-pair are the same two folders with two engines each (one torch
# thread each for faulty-pair's) and no cache, so that their requests reach the engines. The command line's
# --cache-hits-header is every model's.
MODELS_TOML = """
[[models]]
served_model_name = ["minilm"]
cache_bytes = 1048576

[[models]]
model = "{cross_encoder}"
served_model_name = ["rerank"]
max_queued_inputs = 6
cache_bytes = 2048

[[models]]
model = "{clip}"
served_model_name = ["clip"]
min_priority = 0

[[models]]
model = "{faulty}"
served_model_name = ["faulty"]
trust_remote_code = true

[[models]]
model = "{bundled}"
served_model_name = ["minilm-pair"]
engine_count = 2

[[models]]
model = "{faulty}"
served_model_name = ["faulty-pair"]
trust_remote_code = true
engine_count = 2
torch_threads = 1
"""


@pytest.fixture(scope="module")
def several_models(
    bundled_model: Path,
    cross_encoder_model: Path,
    clip_model: Path,
    faulty_model: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[PoolserveProcess]:
    """minilm (the default: engine-0), rerank (engine-1) and clip (engine-2), one API server, from a --config file;
    a fourth, faulty (engine-3), for the poison pill: the three answer, the fourth only crashes; and minilm-pair
    (engines 4 and 5) and faulty-pair (6 and 7) for the tests of a model with two engines (each was a launch of
    --engine-count 2; a model's engines are its own)."""
    file = tmp_path_factory.mktemp("models") / "models.toml"
    file.write_text(
        MODELS_TOML.format(
            cross_encoder=cross_encoder_model, clip=clip_model, faulty=faulty_model, bundled=bundled_model
        )
    )
    server = PoolserveProcess(
        "--config", str(file), "--api-server-count", "1", "--cache-hits-header", *FLOAT32_CPU,
        env=remote_code_env(faulty_model),
    ).wait_ready(180)  # fmt: skip
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def rerank_alone(cross_encoder_model: Path) -> Iterator[InProcessServer]:
    """The cross-encoder served alone, in this process."""
    with served_folder(cross_encoder_model) as started:
        yield started


@pytest.fixture(scope="module")
def clip_alone(clip_model: Path) -> Iterator[InProcessServer]:
    """The CLIP model served alone, in this process."""
    with served_folder(clip_model) as started:
        yield started


def post(server: PoolserveProcess | InProcessServer, path: str, body: dict[str, Any]) -> Any:
    with server.client() as client:
        response = client.post(path, json=body)
    assert response.status_code == 200, response.text
    return response.json()


def vectors(answer: Any) -> np.ndarray:
    return np.asarray([item["embedding"] for item in answer["data"]], dtype=np.float32)


def scores(answer: Any) -> list[tuple[int, float]]:
    return [(item["index"], item["relevance_score"]) for item in answer["results"]]


def test_each_model_answers_as_its_own_one_model_server(
    several_models: PoolserveProcess, server: PoolserveProcess, rerank_alone: InProcessServer
) -> None:
    texts = SENTENCES[:8]
    alone = vectors(post(server, "/v1/embeddings", {"input": texts}))
    named = post(several_models, "/v1/embeddings", {"input": texts, "model": "minilm"})
    assert named["model"] == "minilm"
    np.testing.assert_allclose(vectors(named), alone, atol=1e-6, rtol=0)
    # No `model` field, and TEI's route that has none: the default model.
    np.testing.assert_allclose(
        vectors(post(several_models, "/v1/embeddings", {"input": texts})), alone, atol=1e-6, rtol=0
    )
    np.testing.assert_allclose(
        np.asarray(post(several_models, "/embed", {"inputs": texts}), dtype=np.float32), alone, atol=1e-6, rtol=0
    )
    ranking = {"query": QUERY, "documents": DOCUMENTS}
    for path in ("/rerank", "/v1/rerank", "/v2/rerank"):
        want = scores(post(rerank_alone, path, ranking))
        got = post(several_models, path, {**ranking, "model": "rerank"})
        assert got["model"] == "rerank"
        assert [index for index, _ in scores(got)] == [index for index, _ in want]
        np.testing.assert_allclose([s for _, s in scores(got)], [s for _, s in want], atol=1e-6, rtol=0)


def test_an_unknown_model_is_a_404_listing_the_served_names_in_the_route_s_style(
    several_models: PoolserveProcess,
) -> None:
    with several_models.client() as client:
        for path, body in (
            ("/v1/embeddings", {"input": "hello", "model": "nope"}),  # OpenAI's
            ("/v2/rerank", {"query": QUERY, "documents": DOCUMENTS, "model": "nope"}),  # Cohere's
            ("/v1/rerank", {"query": QUERY, "documents": DOCUMENTS, "model": "nope"}),  # Jina's
        ):
            response = client.post(path, json=body)
            assert response.status_code == 404, (path, response.text)
            error = response.json()["error"]
            assert error["code"] == "model_not_found", error
            assert "'minilm', 'rerank'" in error["message"], error
        # A route the model cannot serve is refused as on a one-model server.
        refused = client.post("/v1/embeddings", json={"input": "hello", "model": "rerank"})
        assert refused.status_code == 400 and refused.json()["error"]["code"] == "task_not_supported", refused.text


def test_models_info_and_health_list_every_model(several_models: PoolserveProcess, cross_encoder_model: Path) -> None:
    with several_models.client() as client:
        listed = client.get("/v1/models").json()["data"]
        assert [(entry["id"], entry["kind"]) for entry in listed] == [
            ("minilm", "embedding"), ("rerank", "classifier"), ("clip", "clip"), ("faulty", "embedding"),
            ("minilm-pair", "embedding"), ("faulty-pair", "embedding"),
        ]  # fmt: skip
        assert listed[1]["root"] == str(cross_encoder_model)
        info = client.get("/info").json()
        assert info["model_id"] == "minilm"
        assert [model["model_id"] for model in info["models"]] == list(SERVED)
        assert "reranker" in info["models"][1]["model_type"]
        health = client.get("/health/ready")
        assert health.status_code == 200 and set(health.json()["models"]) == set(SERVED), health.text


def test_several_models_answer_as_their_own_one_model_servers(
    several_models: PoolserveProcess,
    server: PoolserveProcess,
    rerank_alone: InProcessServer,
    clip_alone: InProcessServer,
) -> None:
    texts = SENTENCES[:4]
    images = [{"image": data_url(encode(make_image(40, 30, seed)))} for seed in (1, 2)]
    for alone, name, body in (
        (server, "minilm", {"input": texts}),
        (clip_alone, "clip", {"input": texts}),
        (clip_alone, "clip", {"input": [texts[0], *images]}),  # text and images in one request
    ):
        got = post(several_models, "/v1/embeddings", {**body, "model": name})
        assert got["model"] == name
        np.testing.assert_allclose(vectors(got), vectors(post(alone, "/v1/embeddings", body)), atol=1e-6, rtol=0)
    ranking = {"query": QUERY, "documents": DOCUMENTS}
    want = scores(post(rerank_alone, "/v1/rerank", ranking))
    got = scores(post(several_models, "/v1/rerank", {**ranking, "model": "rerank"}))
    assert [index for index, _ in got] == [index for index, _ in want]
    np.testing.assert_allclose([s for _, s in got], [s for _, s in want], atol=1e-6, rtol=0)
    with several_models.client() as client:
        unknown = client.post("/v1/embeddings", json={"input": "hi", "model": "nope"})
        assert unknown.status_code == 404 and "'minilm', 'rerank', 'clip'" in unknown.json()["error"]["message"]
        listed = client.get("/v1/models").json()["data"]
        assert [entry["id"] for entry in listed] == list(SERVED)


@pytest.fixture(scope="module")
def thin_pngs() -> dict[tuple[int, int], bytes]:
    """Real PNGs of one value each, made once: a few hundred bytes to a few kB, whatever their size.

    40,000,000x1 is within the default --max-image-pixels; mode "1" keeps it at 5 MB while it is made.
    """
    sizes = [(1, 5000), (1, 100_000), (100_000, 1)]
    pngs = {size: encode(Image.new("L", size, 200)) for size in sizes}
    pngs[(40_000_000, 1)] = encode(Image.new("1", (40_000_000, 1), 1))
    return pngs


def memory_kib(pid: int) -> dict[str, int]:
    """VmRSS (resident now) and VmHWM (the peak resident so far) of a process, in KiB."""
    fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line)
    return {name: int(fields[name].split()[0]) for name in ("VmRSS", "VmHWM")}


def embed_image(client: httpx.Client, image: Image.Image) -> np.ndarray:
    response = client.post("/v1/embeddings", json={"input": [{"image": data_url(encode(image))}], "model": "clip"})
    assert response.status_code == 200, response.text
    return vectors(response.json())


def test_thin_and_wide_images_are_refused_before_any_pixel_is_allocated(
    several_models: PoolserveProcess, clip_model: Path, thin_pngs: dict[tuple[int, int], bytes]
) -> None:
    # Resized to a shortest edge, a 1x5000 image grew a CLIP server by 1 GB, 1x100000 raised MemoryError and
    # 40,000,000x1 an OverflowError, both as plain-text 500s.
    direct = ClipReference(clip_model)
    (pid,) = api_server_pids(several_models).values()
    with several_models.client() as clip:
        assert embed_image(clip, make_image(64, 48, 1)).shape == (1, 16)
        before = memory_kib(pid)
        for (width, height), png in thin_pngs.items():
            assert len(png) < 10_000
            response = clip.post("/v1/embeddings", json={"input": [{"image": data_url(png)}], "model": "clip"})
            assert response.status_code == 400, response.text
            error = response.json()["error"]
            assert error["type"] == "invalid_request_error" and error["param"] == "input[0].image"
            ratio = max(width, height) // min(width, height)
            assert error["message"] == (
                f"input[0].image is {width}x{height}, an aspect ratio of {ratio}:1; this server takes images up to "
                "200:1."
            )
        after = memory_kib(pid)
        assert after["VmRSS"] - before["VmRSS"] < 100 * 1024, (before, after)
        assert after["VmHWM"] - before["VmHWM"] < 100 * 1024, (before, after)
        # The same server still embeds a normal image, and one at the bound, exactly.
        normal = make_image(30, 90, 2)
        np.testing.assert_allclose(embed_image(clip, normal), direct.images([normal]), atol=1e-5)
        at_bound = make_image(2, 400, 5)
        np.testing.assert_allclose(embed_image(clip, at_bound), direct.images([at_bound]), atol=1e-5)


def test_each_model_keeps_its_own_queue_cache_and_priority_and_its_own_metrics(
    several_models: PoolserveProcess,
) -> None:
    """A flood of new documents on rerank (its queue of 6 inputs, its cache of ~8 rows) fails no request of the
    other models and evicts nothing of minilm's cache; each model's table setting holds for it alone; and /metrics
    shows each model's requests, tokens, passes and cache apart, summing to the server's totals."""
    server = several_models
    before = scrape(server.url)
    with server.client() as client:
        # Priority: clip's table lets no request jump its queue; minilm keeps the command line's -100.
        urgent = {"input": "urgent", "priority": -3}
        assert client.post("/v1/embeddings", json={**urgent, "model": "minilm"}).status_code == 200
        refused = client.post("/v1/embeddings", json={**urgent, "model": "clip"})
        assert refused.status_code == 400 and "--min-priority" in refused.text, refused.text
        # Queue limits: 8 inputs are more than rerank's whole queue (413), and nothing to minilm's.
        many = [f"document {i}" for i in range(8)]
        too_many = client.post("/v1/rerank", json={"query": QUERY, "documents": many, "model": "rerank"})
        assert too_many.status_code == 413 and "6 inputs" in too_many.text and "'rerank'" in too_many.text, (
            too_many.text
        )
        assert client.post("/v1/embeddings", json={"input": many, "model": "minilm"}).status_code == 200
        cached = {"input": ["kept in minilm's cache"], "model": "minilm"}
        assert client.post("/v1/embeddings", json=cached).headers["x-cache-hits"] == "0"

    def new_documents(rng: random.Random) -> dict[str, Any]:
        documents = [f"new document {rng.random()}" for _ in range(3)]
        return {"query": QUERY, "documents": documents, "model": "rerank"}

    def image_request(seed: int) -> int:
        body = {"input": [f"picture {seed}", {"image": data_url(encode(make_image(32, 32, seed)))}], "model": "clip"}
        with server.client() as client:
            return client.post("/v1/embeddings", json=body).status_code

    with (
        SteadyLoad(server.url, clients=4, body=new_documents, path="/v1/rerank") as flood,
        SteadyLoad(server.url, clients=1, body={"input": SENTENCES[:4], "model": "minilm"}) as embeds,
    ):
        flood.wait_for(40)
        embeds.wait_for(10)
        with ThreadPoolExecutor(2) as pool:
            images = list(pool.map(image_request, range(6)))
    assert images == [200] * 6
    assert embeds.failures == [] and set(embeds.statuses) == {200}, (embeds.failures, embeds.statuses)
    assert flood.failures == [] and set(flood.statuses) <= {200, 429}, (flood.failures, flood.statuses)
    with server.client() as client:
        assert client.post("/v1/embeddings", json=cached).headers["x-cache-hits"] == "1"
    after = scrape(server.url)

    def moved(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    assert moved("poolserve_cache_evictions_total", engine="1", model="rerank") > 0
    assert moved("poolserve_cache_evictions_total", model="minilm") == 0
    assert moved("poolserve_cache_hits_total", engine="0", model="minilm") > 0
    embedded = {name: moved("poolserve_requests_total", endpoint="/v1/embeddings", model=name) for name in MODELS}
    assert embedded["clip"] == 7 and embedded["minilm"] >= 10 + 4, embedded
    ranked = moved("poolserve_requests_total", endpoint="/v1/rerank", model="rerank")
    assert ranked == sum(flood.statuses.values()) + 1  # the flood and the 413
    for name in (
        "poolserve_requests_total",
        "poolserve_prompt_tokens_total",
        "poolserve_request_duration_seconds_count",
    ):
        by_model = [moved(name, model=model) for model in (*SERVED, "")]
        assert sum(by_model) == moved(name) and all(by_model[:3]), (name, by_model)
    assert moved("poolserve_images_total", endpoint="/v1/embeddings", model="clip") == 6
    for engine, model in enumerate(MODELS):  # each model's engine, numbered in the order declared
        assert moved("poolserve_batch_inputs_count", engine=str(engine), model=model) > 0, model
        assert moved("poolserve_batch_inputs_count", engine=str(engine)) == moved(
            "poolserve_batch_inputs_count", model=model
        ), model
    assert moved("poolserve_forward_duration_seconds_count", model="clip", modality="image") > 0


def killed_by_sigsegv(log: str) -> list[str]:
    """The engines (`engine-N`) whose death by SIGSEGV the supervisor logged, in order."""
    return re.findall(r"(engine-\d) \(pid \d+\) was killed by SIGSEGV", log)


@pytest.mark.alone
def test_a_poison_pill_in_one_model_leaves_the_others_latency_within_noise(several_models: PoolserveProcess) -> None:
    """Under steady load on minilm, one poison pill sent to faulty: it crashes faulty's engine, runs alone on the
    restarted one, crashes it again and is failed (500 poison_pill), and faulty serves after its second restart.
    minilm's requests all succeed meanwhile; none takes as long as faulty's second restart took (a request that
    waited on it would), and their p90 while the pill is handled stays under max(3 x, + 1 s) their p90 in the window
    just before. The bound is loose for what this 2-core host shares with the restarts: a new engine importing torch
    and loading its model takes CPU from minilm's engine (bench/poison_isolation.py at load 9-13: p90 216 -> 653 ms
    during pills, 569 ms during two plain restarts, each restart 20-25 s; here p90 34 -> 43 and 10 -> 24 ms; see
    docs/benchmarks.md); and tight for what isolation means: a minilm request that waited on faulty's restart, or an
    API server stalled by faulty's engine loss, breaks it."""
    server = several_models
    mark = len(server.stderr())
    pills: list[dict[str, Any]] = []
    with SteadyLoad(server.url, clients=2, body={"input": SENTENCES[:4], "model": "minilm"}) as load:
        load.wait_for(10)
        before, _ = finished_during(load, lambda: load.wait_for(sum(load.statuses.values()) + 40, timeout=60))
        during, seconds = finished_during(load, lambda: pills.append(send_pill(server.url, timeout=60)))
    (pill,) = pills
    assert pill["status"] == 500 and pill["code"] == "poison_pill", pill
    assert load.failures == [] and set(load.statuses) == {200}, (load.failures, load.statuses)
    killed = killed_by_sigsegv(server.stderr()[mark:])
    assert killed == ["engine-3", "engine-3"], server.stderr()[mark:]
    quiet, poisoned = percentile(sorted(before), 90), percentile(sorted(during), 90)
    print(f"minilm p90 {quiet * 1000:.0f} ms before, {poisoned * 1000:.0f} ms during the pill's {seconds:.1f} s")
    assert poisoned < max(3 * quiet, quiet + 1.0), (quiet, poisoned, sorted(during)[-5:])
    restart = pill["serving_again_s"] - pill["answered_s"]
    assert max(during) < restart, (max(during), restart)


MIN_COSINE = 0.9999


def forward_passes(server: PoolserveProcess, engine: str) -> float:
    """How many forward passes the engine of this index has run, from /metrics' `engine` label."""
    return value(scrape(server.url), "poolserve_batch_inputs_count", engine=engine)


def test_two_engines_both_serve_and_answer_as_sentence_transformers(
    several_models: PoolserveProcess, bundled_model: Path
) -> None:
    """minilm-pair's two engines (4 and 5) both take work, and every answer is Sentence-Transformers'."""
    want = SentenceTransformer(str(bundled_model), device="cpu").encode(SENTENCES[:24], convert_to_numpy=True)
    before = {engine: forward_passes(several_models, engine) for engine in ("4", "5")}

    def one(sentence: str) -> npt.NDArray[np.float32]:
        with several_models.client() as client:
            response = client.post("/v1/embeddings", json={"input": [sentence], "model": "minilm-pair"})
        assert response.status_code == 200, response.text
        return np.asarray(response.json()["data"][0]["embedding"], dtype=np.float32)

    with ThreadPoolExecutor(8) as pool:
        got = np.stack(list(pool.map(one, SENTENCES[:24])))
    cosine = (got * want).sum(axis=1) / np.linalg.norm(got, axis=1) / np.linalg.norm(want, axis=1)
    assert cosine.min() >= MIN_COSINE, f"lowest cosine {cosine.min()} at sentence {cosine.argmin()}"
    assert all(forward_passes(several_models, engine) > before[engine] for engine in ("4", "5")), before


def silent_engines(client: httpx.Client, model: str) -> list[int] | None:
    """A model's engines (numbered within the model) that have not answered lately, from /health/ready."""
    health = client.get("/health/ready")
    return health.json()["models"][model].get("silent_engines", []) if health.status_code == 200 else None


def test_a_killed_engine_s_requests_move_to_the_other_and_it_comes_back(several_models: PoolserveProcess) -> None:
    """minilm-pair's second engine (engine-5) killed under load: its requests move to the first, it is named silent
    while down, and once restarted it takes work again; no request fails."""
    server = several_models
    victim = engine_pids(server)["5"]
    body = {"input": [f"sentence number {i} about search and retrieval" for i in range(8)], "model": "minilm-pair"}
    with SteadyLoad(server.url, clients=4, body=body) as load:
        load.wait_for(8)
        os.kill(victim, signal.SIGKILL)
        with server.client() as client:
            # Down, it is named in /health/ready while the other serves (restarting, as out of service).
            assert wait_until(lambda: silent_engines(client, "minilm-pair") == [1], 10), client.get(
                "/health/ready"
            ).text
        ready_line_time(server, "engine-5", victim, timeout=60)
        before = forward_passes(server, "5")
        load.wait_for(sum(load.statuses.values()) + 8)
        # The restarted engine takes work again.
        assert wait_until(lambda: forward_passes(server, "5") > before, 10)
    assert load.failures == [], load.failures
    assert set(load.statuses) == {200}, load.statuses
    assert "lost engine 1; moving its" in server.stderr()


def test_with_two_engines_a_poison_pill_kills_only_its_own_engine_and_the_other_serves_throughout(
    several_models: PoolserveProcess,
) -> None:
    """Blamed at its first crash (the API server reads the dead engine's flight record), the pill is never sent to
    the other engine: it waits for its own engine's restart, runs alone there, and the second crash fails it. The
    other engine never dies and answers a steady load all along; the requests sent beside the pill get their rows."""
    server = several_models
    with SteadyLoad(server.url, clients=2, body={"input": "a steady request", "model": "faulty-pair"}) as load:
        load.wait_for(10)
        mark = len(server.stderr())
        pill_is_failed_and_its_neighbours_served(server, model="faulty-pair")
        served = sum(load.statuses.values())
        load.wait_for(served + 10)

    # The supervisor logs the second death when it reaps the engine, which can come after the API server has failed
    # the pill and the other engine has answered the load (faulty-pair's other engine needs no restart to serve).
    wait_until(lambda: len(killed_by_sigsegv(server.stderr()[mark:])) >= 2, 10)
    log = server.stderr()[mark:]
    killed = killed_by_sigsegv(log)
    assert len(killed) == 2 and len(set(killed)) == 1 and killed[0] in ("engine-6", "engine-7"), log
    assert "suspect(s) (in its forward pass) wait for its restart" in log, log
    assert load.failures == [] and set(load.statuses) == {200}, load.statuses
    print(f"steady load: {sum(load.statuses.values())} answered, slowest {max(load.latencies):.2f}s")


def test_a_killed_engine_of_one_model_leaves_the_others_answering(several_models: PoolserveProcess) -> None:
    """engine-1 (rerank) killed under load on all three models: the embedder's and CLIP's requests all succeed, the
    reranker's are resubmitted to its restarted engine, and /health/ready names the model that is down meanwhile.
    Last in this module: the other tests read the models' caches and metrics as they were."""
    server = several_models
    victim = engine_pids(server)["1"]
    embedder = engine_pids(server)["0"]
    ranking: dict[str, object] = {"query": QUERY, "documents": DOCUMENTS, "model": "rerank"}
    down: list[str] = []

    def names_the_model() -> bool:
        with server.client() as client:
            health = client.get("/health/ready")
        if health.status_code == 503:
            down.append(health.json()["error"]["message"])
        return bool(down)

    with (
        SteadyLoad(server.url, clients=2, body={"input": SENTENCES[:4], "model": "minilm"}) as embeds,
        SteadyLoad(server.url, clients=1, body=ranking, path="/v1/rerank") as reranks,
        SteadyLoad(server.url, clients=1, body={"input": SENTENCES[4:6], "model": "clip"}) as clips,
    ):
        embeds.wait_for(4)
        clips.wait_for(2)
        reranks.wait_for(2)
        os.kill(victim, signal.SIGKILL)
        at_kill = sum(embeds.statuses.values())
        assert wait_until(names_the_model, 10), server.log()
        ready_line_time(server, "engine-1", victim, timeout=90)
        served_meanwhile = sum(embeds.statuses.values()) - at_kill
        reranks.wait_for(sum(reranks.statuses.values()) + 2)
        embeds.wait_for(sum(embeds.statuses.values()) + 4)
        clips.wait_for(sum(clips.statuses.values()) + 2)
    assert "'rerank'" in down[0], down
    assert embeds.failures == [] and set(embeds.statuses) == {200}, (embeds.failures, embeds.statuses)
    assert reranks.failures == [] and set(reranks.statuses) == {200}, (reranks.failures, reranks.statuses)
    assert clips.failures == [] and set(clips.statuses) == {200}, (clips.failures, clips.statuses)
    assert served_meanwhile > 0  # the embedder answered while the reranker's engine restarted
    assert engine_pids(server)["0"] == embedder
    assert "the other models serve on" in server.stderr()
