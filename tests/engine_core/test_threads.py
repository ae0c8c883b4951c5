"""The engine's thread count follows the batch on a CPU: one thread for a few short inputs, all for a large batch."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest
import torch

from engine_core.threads import SMALL_BATCH_TOKENS, ThreadPlan


@pytest.fixture
def restore_threads() -> Iterator[None]:
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def test_a_small_batch_runs_on_one_thread_and_a_large_one_on_all(restore_threads: None) -> None:
    torch.set_num_threads(2)
    plan = ThreadPlan("cpu", 2)
    plan.apply(SMALL_BATCH_TOKENS)
    assert torch.get_num_threads() == 1
    plan.apply(SMALL_BATCH_TOKENS + 1)
    assert torch.get_num_threads() == 2
    plan.apply(SMALL_BATCH_TOKENS)
    assert torch.get_num_threads() == 1
    plan.apply(8, is_urgent=True)  # a priority < 0 request: someone waits for it
    assert torch.get_num_threads() == 2
    plan.apply(SMALL_BATCH_TOKENS)
    assert torch.get_num_threads() == 1
    plan.apply(8, nothing_waits=True)  # nothing queued behind the batch: nothing else wants the cores
    assert torch.get_num_threads() == 2


def test_one_configured_thread_and_cuda_are_left_alone(restore_threads: None) -> None:
    torch.set_num_threads(1)
    ThreadPlan("cpu", 1).apply(10_000)
    assert torch.get_num_threads() == 1
    torch.set_num_threads(2)
    ThreadPlan("cuda", 2).apply(1)
    assert torch.get_num_threads() == 2


def test_each_thread_keeps_its_own_count(restore_threads: None) -> None:
    """Why engine.py keeps a plan per lane: a count set on one OS thread (after that thread's first use of torch)
    leaves another thread's alone."""
    torch.set_num_threads(2)
    seen: dict[str, int] = {}
    lane_set = threading.Event()
    main_read = threading.Event()

    def lane() -> None:
        torch.get_num_threads()  # the thread's first use: its count starts from the process's
        ThreadPlan("cpu", 2).use(1)
        seen["lane, after its own use(1)"] = torch.get_num_threads()
        lane_set.set()
        main_read.wait(10)
        seen["lane, after main's use(2)"] = torch.get_num_threads()

    thread = threading.Thread(target=lane)
    thread.start()
    assert lane_set.wait(10)
    seen["main, after the lane's use(1)"] = torch.get_num_threads()
    plan = ThreadPlan("cpu", 2)
    plan.current = 1
    plan.use(2)
    main_read.set()
    thread.join(10)
    assert seen == {"lane, after its own use(1)": 1, "main, after the lane's use(1)": 2, "lane, after main's use(2)": 1}
