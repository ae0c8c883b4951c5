"""The engine's step in process: a real model (the bundled one), no sockets, no threads."""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Iterator
from typing import Any

import msgspec
import numpy as np
import numpy.typing as npt
import pytest
import torch
from prometheus_client import REGISTRY

from engine_core.admission import AdmissionLimit
from engine_core.core import EngineCore, StepOutputs
from engine_core.embedding_cache import EmbeddingCache
from engine_core.load_model import load_model
from engine_core.loader import LoadedModel
from engine_core.metrics import set_engine_index
from engine_core.postprocess import l2_normalize
from engine_core.request_state import InvalidRequest, check_request
from engine_core.scheduler import PriorityPolicy
from engine_core.threads import ThreadPlan
from poolserve.config import Config
from poolserve.protocol import EngineRequest, PooledOutput
from tests.engine_core.pending import pool_request

F32 = npt.NDArray[np.float32]
HELLO = [101, 7592, 102]
SENTENCES = [[101, 7592, 2088, 102], [101, 1037, 2204, 2154, 2000, 2017, 102], HELLO, [101, 102]]


@pytest.fixture(scope="module")
def loaded() -> LoadedModel:
    # Batches of at most two inputs, so that a request of more inputs spans several steps. The cost of a
    # forward pass is fixed rather than measured: timed on a busy machine it can come out 0, and then
    # the scheduler rightly runs each input alone (the flake of the two-servers test below).
    return dataclasses.replace(load_model(Config(device="cpu", max_batch_size=2)), batch_overhead_tokens=64.0)


@pytest.fixture
def core(loaded: LoadedModel) -> Iterator[EngineCore]:
    threads = torch.get_num_threads()
    core = EngineCore(loaded, AdmissionLimit(max_inputs=64, max_tokens=4096))
    yield core
    # A step sets this thread's torch threads for its batch (engine_core/threads.py); the tests after it in this
    # process (PYTEST_WORKERS=0) expect the count they started with.
    torch.set_num_threads(threads)
    # Whatever a test did, every admitted input was released exactly once.
    assert (core.admission.inputs, core.admission.tokens, core.running, core.waiting) == (0, 0, 0, 0)


def submit(core: EngineCore, identity: bytes, request_id: int, job: EngineRequest) -> None:
    """What the I/O thread does with a decoded request: check it, count it against the admission limit, queue it."""
    job.id = request_id
    request = check_request(identity, job, core.card)
    assert core.admission.try_admit(request.count, request.total_cost)
    core.add(request)


def run_until_idle(core: EngineCore) -> tuple[dict[tuple[bytes, int], tuple[PooledOutput, F32]], int]:
    """Every step until nothing waits: the finished outputs by (server, id), and how many steps ran."""
    outputs: dict[tuple[bytes, int], tuple[PooledOutput, F32]] = {}
    steps = 0
    while (batch := core.next_batch()) is not None:
        step = core.run_batch(batch)
        steps += 1
        assert not step.failures
        for identity, finished in step.outputs.items():
            outputs.update({(identity, out.id): (out, rows) for out, rows in finished})
    return outputs, steps


def reference(loaded: LoadedModel, rows: list[list[int]]) -> F32:
    return np.concatenate([loaded.runner.run_texts([np.asarray(row, dtype=np.int32)], None) for row in rows])


def test_requests_from_two_servers_come_back_as_the_model_computes_them(core: EngineCore, loaded: LoadedModel) -> None:
    submit(core, b"api-0", 1, pool_request(SENTENCES[:3]))
    submit(core, b"api-1", 1, pool_request(SENTENCES[3:]))
    outputs, steps = run_until_idle(core)
    assert set(outputs) == {(b"api-0", 1), (b"api-1", 1)}
    assert steps == 2  # four inputs in batches of two
    out, rows = outputs[(b"api-0", 1)]
    assert (out.rows, out.dim) == (3, loaded.card.output_size)
    # The bundled model asks for normalized embeddings; batching (padding) changes them by float noise only.
    np.testing.assert_allclose(rows, l2_normalize(reference(loaded, SENTENCES[:3])), atol=1e-5)
    np.testing.assert_allclose(outputs[(b"api-1", 1)][1], l2_normalize(reference(loaded, SENTENCES[3:])), atol=1e-5)
    assert out.queue_time >= 0 and out.inference_time > 0


def test_a_request_finishes_only_when_its_last_input_has_run(core: EngineCore) -> None:
    submit(core, b"api-0", 7, pool_request(SENTENCES))
    first = core.run_batch(batch) if (batch := core.next_batch()) else StepOutputs()
    assert not first.servers and core.running == 1
    outputs, _ = run_until_idle(core)
    assert outputs[(b"api-0", 7)][1].shape[0] == 4


def test_the_requests_options_shape_its_rows(core: EngineCore, loaded: LoadedModel) -> None:
    submit(core, b"api-0", 1, pool_request([HELLO], normalize=False))
    submit(core, b"api-0", 2, pool_request([HELLO], dimensions=8))
    outputs, _ = run_until_idle(core)
    raw = reference(loaded, [HELLO])
    np.testing.assert_allclose(outputs[(b"api-0", 1)][1], raw, atol=1e-5)
    matryoshka = outputs[(b"api-0", 2)][1]
    assert matryoshka.shape == (1, 8)
    np.testing.assert_allclose(matryoshka, l2_normalize(raw[:, :8]), atol=1e-5)


def test_an_aborted_request_never_runs_and_gives_back_its_place_in_the_queue(core: EngineCore) -> None:
    submit(core, b"api-0", 1, pool_request(SENTENCES))
    submit(core, b"api-0", 2, pool_request([HELLO]))
    assert core.admission.inputs == 5
    core.abort(b"api-0", [1])
    core.abort(b"api-1", [2])  # another server's ids: nothing of api-0's is touched
    assert core.admission.inputs == 1
    outputs, steps = run_until_idle(core)
    assert set(outputs) == {(b"api-0", 2)} and steps == 1


@pytest.mark.parametrize("inputs", [4, 12], ids=["within one window", "past the scheduler's window"])
def test_an_abort_between_steps_saves_the_inputs_not_run_yet(core: EngineCore, inputs: int) -> None:
    submit(core, b"api-0", 1, pool_request([HELLO] * inputs))
    batch = core.next_batch()
    assert batch is not None
    core.run_batch(batch)
    core.abort(b"api-0", [1])
    assert core.next_batch() is None
    assert not core.has_work()


class Exploding:
    def run_texts(self, rows: object, type_rows: object) -> F32:
        raise RuntimeError("CUDA error: an illegal memory access")

    def run_images(self, pixels: object) -> F32:
        raise RuntimeError("unreachable")


def test_a_failed_forward_pass_fails_its_requests_and_the_engine_goes_on(core: EngineCore, loaded: LoadedModel) -> None:
    submit(core, b"api-0", 1, pool_request([HELLO]))
    submit(core, b"api-1", 2, pool_request([HELLO]))
    core.runner = Exploding()
    batch = core.next_batch()
    assert batch is not None
    step = core.run_batch(batch)
    assert not step.outputs and step.servers == {b"api-0", b"api-1"}
    (failure,) = step.failures[b"api-0"]
    assert (failure.id, failure.code) == (1, "model_error")
    assert "RuntimeError: CUDA error" in failure.message
    core.runner = loaded.runner
    submit(core, b"api-0", 3, pool_request([HELLO]))
    outputs, _ = run_until_idle(core)
    assert set(outputs) == {(b"api-0", 3)}


class NanFor:
    """The real runner, except that an input holding `token` comes out as NaN (an overflow, as float16
    gives a bfloat16-trained model)."""

    def __init__(self, runner: Any, token: int):
        self.runner, self.token = runner, token

    def run_texts(self, rows: list[npt.NDArray[np.int32]], type_rows: Any) -> F32:
        out = self.runner.run_texts(rows, type_rows)
        out[[self.token in row for row in rows]] = np.nan
        return out  # type: ignore[no-any-return]


def test_a_row_that_is_not_finite_fails_its_request_and_never_reaches_the_client(
    core: EngineCore, loaded: LoadedModel
) -> None:
    submit(core, b"api-0", 1, pool_request([HELLO, [101, 999, 102]]))
    submit(core, b"api-0", 2, pool_request([HELLO]))
    core.runner = NanFor(loaded.runner, 999)  # type: ignore[assignment]
    failures, outputs = [], []
    while (batch := core.next_batch()) is not None:
        step = core.run_batch(batch)
        failures += step.failures[b"api-0"]
        outputs += step.outputs[b"api-0"]
    core.runner = loaded.runner
    (failure,) = failures
    assert (failure.id, failure.code) == (1, "model_error")
    assert "non-finite values (NaN or infinity) for this request (output rows [1])" in failure.message
    ((out, rows),) = outputs
    assert out.id == 2 and np.isfinite(rows).all()


def test_an_urgent_request_displaces_the_rest_of_a_window_and_runs_next(core: EngineCore) -> None:
    submit(core, b"api-0", 1, pool_request([HELLO] * 8))  # a window of 4 batches of 2
    first = core.next_batch()
    assert first is not None
    core.run_batch(first)
    submit(core, b"api-1", 2, pool_request([HELLO], priority=-1))
    urgent = core.next_batch()
    assert urgent is not None and (b"api-1", 2) in {item.request.key for item in urgent}
    core.run_batch(urgent)
    outputs, _ = run_until_idle(core)
    assert (b"api-0", 1) in outputs  # every input of the displaced window still ran


def test_a_repeated_input_is_answered_from_the_cache_with_the_computed_row(loaded: LoadedModel) -> None:
    core = EngineCore(loaded, AdmissionLimit(max_inputs=64, max_tokens=4096), EmbeddingCache(1 << 20))
    submit(core, b"api-0", 1, pool_request(SENTENCES))
    first, _ = run_until_idle(core)
    # All cached: answered without a step, each finishing (normalize, dimensions) its own.
    submit(core, b"api-0", 2, pool_request(SENTENCES, dimensions=8, normalize=False))
    assert core.next_batch() is None
    step = core.take_answered_from_cache()
    assert step is not None
    ((out, rows),) = step.outputs[b"api-0"]
    assert (out.id, out.cached) == (2, len(SENTENCES))
    raw = reference(loaded, SENTENCES)
    np.testing.assert_allclose(rows, raw[:, :8], atol=1e-6)
    np.testing.assert_allclose(first[(b"api-0", 1)][1], raw / np.linalg.norm(raw, axis=1, keepdims=True), atol=1e-6)
    # Partly cached: only the new input runs.
    submit(core, b"api-0", 3, pool_request([SENTENCES[0], [101, 2204, 102]]))
    batch = core.next_batch()
    assert batch is not None and [item.index for item in batch] == [1]
    step = core.run_batch(batch)
    ((out, _),) = step.outputs[b"api-0"]
    assert out.cached == 1
    assert (core.admission.inputs, core.running, core.waiting) == (0, 0, 0)
    assert core.take_answered_from_cache() is None  # nothing left to answer


def test_per_token_requests_get_every_tokens_state_beside_pooled_ones_and_the_cache_keeps_them_apart(
    loaded: LoadedModel,
) -> None:
    core = EngineCore(loaded, AdmissionLimit(max_inputs=64, max_tokens=4096), EmbeddingCache(1 << 20))
    pair = SENTENCES[:2]
    for request_id in (1, 2):
        submit(core, b"api-0", request_id, pool_request(pair, normalize=False, per_token=request_id == 2))
    outputs, _ = run_until_idle(core)
    pooled, states = outputs[(b"api-0", 1)][1], outputs[(b"api-0", 2)][1]
    assert states.shape == (sum(map(len, pair)), loaded.card.output_size)
    # The bundled model mean-pools: each input's token states average to its pooled row.
    means = [chunk.mean(axis=0) for chunk in np.split(states, [len(pair[0])])]
    np.testing.assert_allclose(np.stack(means), pooled, atol=1e-5)
    # Both are cached, each under its own key: the same ids asked each way get their own rows back.
    for request_id, per_token in ((3, True), (4, False)):
        submit(core, b"api-0", request_id, pool_request(pair, normalize=False, per_token=per_token))
    step = core.take_answered_from_cache()
    assert step is not None and core.next_batch() is None
    answers = {out.id: rows for out, rows in step.outputs[b"api-0"]}
    np.testing.assert_array_equal(answers[3], states)
    np.testing.assert_array_equal(answers[4], pooled)


def test_a_model_without_token_states_refuses_per_token_requests(loaded: LoadedModel) -> None:
    card = msgspec.structs.replace(loaded.card, tasks=["classify"])
    job = pool_request([HELLO], per_token=True)
    with pytest.raises(InvalidRequest, match="per-token"):
        check_request(b"api-0", job, card)


def test_a_flood_at_the_most_urgent_priority_holds_a_default_request_only_until_it_is_overdue(
    loaded: LoadedModel,
) -> None:
    """A client may ask for the most urgent level the operator allows; ageing (a level per 5 s) alone let a
    flood there hold a priority-0 request for 300 s (then 504). Overdue, it goes ahead of the flood."""
    policy = PriorityPolicy(most_urgent=-50, max_wait_s=0.5)
    core = EngineCore(loaded, AdmissionLimit(max_inputs=64, max_tokens=4096), priority=policy)
    flood = pool_request([HELLO] * 4, priority=-50)
    submit(core, b"api-0", 0, pool_request([SENTENCES[1]]))
    started = time.monotonic()
    request_id, flood_answered = 1, 0
    default_answered_at = None
    while default_answered_at is None and time.monotonic() - started < 10:
        while core.waiting < 4:  # the flood never lets up: four requests waiting at every step
            submit(core, b"api-1", request_id, flood)
            request_id += 1
        step = core.run_batch(core.next_batch())  # type: ignore[arg-type]
        for identity, finished in step.outputs.items():
            if identity == b"api-0":
                default_answered_at = time.monotonic()
            flood_answered += len(finished)
    waited = (default_answered_at or math.inf) - started
    run_until_idle(core)
    assert flood_answered >= 2  # the flood was served meanwhile
    assert waited < policy.max_wait_s + 2, f"waited {waited:.1f} s behind the flood"


def test_a_traced_request_gets_the_forward_passes_it_rode_in_and_an_untraced_one_none(core: EngineCore) -> None:
    traced = pool_request(SENTENCES[:3], traced=True)
    submit(core, b"api-0", 1, traced)
    submit(core, b"api-0", 2, pool_request([HELLO]))
    before = time.time_ns()
    outputs, steps = run_until_idle(core)
    out, _ = outputs[(b"api-0", 1)]
    assert outputs[(b"api-0", 2)][0].passes is None
    assert out.passes is not None and len(out.passes) == steps == 2  # four inputs in batches of two
    assert sum(forward.request_inputs for forward in out.passes) == 3
    for forward in out.passes:
        assert before <= forward.start_ns <= forward.end_ns <= time.time_ns()
        assert forward.batch_inputs == 2 and forward.padded_tokens >= forward.batch_tokens
    # The passes' inputs are the four sent, their tokens all of theirs.
    assert sum(forward.batch_tokens for forward in out.passes) == sum(map(len, [*SENTENCES[:3], HELLO]))
    assert out.passes[0].end_ns <= out.passes[1].start_ns


def test_every_engine_series_carries_its_engine_and_its_model(loaded: LoadedModel) -> None:
    """One server, several models: each engine's figures are labelled with its model's served name, so the models'
    passes, queues and cache hits show apart on /metrics."""
    mine = {"engine": "7", "model": "reranker"}

    def read(name: str, **more: str) -> float:
        return REGISTRY.get_sample_value(name, {**mine, **more}) or 0.0

    set_engine_index(7, "reranker")
    try:
        core = EngineCore(loaded, AdmissionLimit(max_inputs=64, max_tokens=4096), EmbeddingCache(1 << 20))
        for request_id in (1, 2):  # the second is all cache hits
            submit(core, b"api-0", request_id, pool_request(SENTENCES[:2]))
            run_until_idle(core)
        assert core.take_answered_from_cache() is not None
        assert read("poolserve_forward_duration_seconds_count", modality="text") == 1
        assert read("poolserve_queue_duration_seconds_count") == 1
        assert read("poolserve_batch_inputs_sum") == 2
        assert read("poolserve_batch_tokens_count") == 1
        assert (read("poolserve_cache_misses_total"), read("poolserve_cache_hits_total")) == (2, 2)
        assert read("poolserve_cache_bytes") > 0
    finally:
        set_engine_index(0, "")


def test_short_requests_with_nothing_behind_them_get_every_thread_and_with_work_behind_one(core: EngineCore) -> None:
    """engine_core/threads.py: a few short inputs run on one torch thread while work is queued behind them, and on
    every thread when nothing is (a single client's request, or a few clients' paired in one pass)."""
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        core.threads = ThreadPlan("cpu", 2)
        submit(core, b"api-0", 1, pool_request([HELLO]))
        run_until_idle(core)
        assert torch.get_num_threads() == 2

        def threads_of_each_pass() -> list[tuple[int, int]]:
            ran = []
            while (batch := core.next_batch()) is not None:
                core.run_batch(batch)
                ran.append((len(batch), torch.get_num_threads()))
            return ran

        # two requests in one pass (batches of two), nothing behind them
        submit(core, b"api-0", 2, pool_request([HELLO]))
        submit(core, b"api-1", 2, pool_request([HELLO]))
        assert threads_of_each_pass() == [(2, 2)]
        # three: the first pass of two has one queued behind it
        for server in (b"api-0", b"api-1", b"api-2"):
            submit(core, server, 3, pool_request([HELLO]))
        assert threads_of_each_pass() == [(2, 1), (1, 2)]
    finally:
        torch.set_num_threads(before)
