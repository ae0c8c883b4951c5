from __future__ import annotations

import itertools

import numpy as np
import pytest

from engine_core.scheduler import AGING_S, PriorityPolicy, Scheduler, WorkItem
from tests.engine_core.pending import make_request


def drain(scheduler: Scheduler) -> list[list[WorkItem]]:
    batches = []
    while scheduler.has_work():
        batches.extend(scheduler.next_batches())
    return batches


def test_every_input_is_scheduled_exactly_once() -> None:
    scheduler = Scheduler(max_batch_tokens=64, max_batch_size=4)
    requests = [make_request(i, [1 + (7 * i + j) % 13 for j in range(i % 5 + 1)]) for i in range(30)]
    for request in requests:
        scheduler.add(request)
    seen = [(item.request.id, item.index) for batch in drain(scheduler) for item in batch]
    expected = [(r.id, j) for r in requests for j in range(len(r.lengths))]
    assert sorted(seen) == sorted(expected)
    assert len(seen) == len(set(seen))


def test_batches_respect_the_padded_token_budget_and_size_cap() -> None:
    scheduler = Scheduler(max_batch_tokens=40, max_batch_size=3)
    scheduler.add(make_request(0, [5, 17, 3, 9, 12, 20, 1, 8, 8, 14]))
    for batch in drain(scheduler):
        assert len(batch) <= 3
        assert len(batch) * max(item.length for item in batch) <= 40


def test_inputs_within_a_window_are_sorted_by_length() -> None:
    scheduler = Scheduler(max_batch_tokens=1000, max_batch_size=2)
    scheduler.add(make_request(0, [9, 1, 5]))
    scheduler.add(make_request(1, [2, 8, 3]))
    lengths = [item.length for batch in scheduler.next_batches() for item in batch]
    assert lengths == sorted(lengths) == [1, 2, 3, 5, 8, 9]


def test_a_small_request_behind_a_big_one_shares_the_first_window() -> None:
    # Once first come, first served: the small request waited behind all ten inputs of the big one.
    scheduler = Scheduler(max_batch_tokens=100, max_batch_size=2, window_batches=2)
    scheduler.add(make_request(0, [4] * 10))
    scheduler.add(make_request(1, [4]))
    first = [item.request.id for batch in scheduler.next_batches() for item in batch]
    assert sorted(first) == [0, 0, 0, 1]  # a batch's worth of each in turn, until the window is full
    rest = [item.request.id for batch in drain(scheduler) for item in batch]
    assert rest == [0] * 7


def test_round_robin_gives_each_request_a_batch_worth_in_turn() -> None:
    scheduler = Scheduler(max_batch_tokens=100, max_batch_size=2, window_batches=3)
    for request_id in range(3):
        scheduler.add(make_request(request_id, [4] * 6))
    first = [item.request.id for batch in scheduler.next_batches() for item in batch]
    assert sorted(first) == [0, 0, 1, 1, 2, 2]


def test_lower_priority_numbers_go_first() -> None:
    scheduler = Scheduler(max_batch_tokens=100, max_batch_size=1, window_batches=1)
    for request_id, priority in enumerate([0, 5, -3, 0]):
        scheduler.add(make_request(request_id, [3], priority=priority))
    assert [batch[0].request.id for batch in drain(scheduler)] == [2, 0, 3, 1]


def test_waiting_improves_a_priority_so_nothing_starves() -> None:
    scheduler = Scheduler(max_batch_tokens=100, max_batch_size=1, window_batches=1)
    bulk = make_request(0, [3], priority=2)
    bulk.admitted_at -= 2 * AGING_S + 0.1  # waited two agings: now as urgent as priority 0
    scheduler.add(bulk)
    scheduler.add(make_request(1, [3], priority=1))
    scheduler.add(make_request(2, [3], priority=0))
    assert [batch[0].request.id for batch in drain(scheduler)] == [0, 2, 1]  # ties go to the oldest


def test_an_overdue_request_goes_ahead_of_the_most_urgent_level_and_ageing_stops_there() -> None:
    policy = PriorityPolicy(most_urgent=-5, max_wait_s=3.0)
    scheduler = Scheduler(max_batch_tokens=100, max_batch_size=1, window_batches=1, priority=policy)
    overdue = make_request(0, [3], priority=0)
    overdue.admitted_at -= 3.1
    urgent_old = make_request(1, [3], priority=-5)
    urgent_old.admitted_at -= 2.9  # would age past -5 with no floor, and still not be overdue
    assert policy.rank(overdue, overdue.admitted_at + 3.1) == -6
    assert policy.rank(urgent_old, urgent_old.admitted_at + 2.9) == -5
    for request in (make_request(2, [3], priority=-5), urgent_old, overdue, make_request(3, [3], priority=7)):
        scheduler.add(request)
    assert [batch[0].request.id for batch in drain(scheduler)] == [0, 1, 2, 3]


def test_a_more_urgent_arrival_is_reported_until_the_next_window() -> None:
    scheduler = Scheduler(max_batch_tokens=100, max_batch_size=2)
    scheduler.add(make_request(0, [3] * 8))
    scheduler.next_batches()
    assert not scheduler.has_arrival_more_urgent_than(0)
    scheduler.add(make_request(1, [3], priority=0))
    assert not scheduler.has_arrival_more_urgent_than(0)
    scheduler.add(make_request(2, [3], priority=-1))
    assert scheduler.has_arrival_more_urgent_than(0)
    scheduler.next_batches()
    assert not scheduler.has_arrival_more_urgent_than(0)


def test_inputs_given_back_are_scheduled_again_exactly_once() -> None:
    scheduler = Scheduler(max_batch_tokens=100, max_batch_size=2, window_batches=2)
    big = make_request(0, [1, 2, 3, 4, 5, 6, 7, 8])
    scheduler.add(big)
    window = scheduler.next_batches()
    scheduler.give_back([item for batch in window[1:] for item in batch])
    scheduler.add(make_request(1, [9], priority=-1))
    seen = [(item.request.id, item.index) for batch in window[:1] + drain(scheduler) for item in batch]
    assert sorted(seen) == [(0, i) for i in range(8)] + [(1, 0)]
    assert seen[len(window[0])] == (1, 0)  # the urgent request comes right after the batch that ran


def test_first_come_first_served_across_windows() -> None:
    scheduler = Scheduler(max_batch_tokens=100, max_batch_size=1, window_batches=1)
    for i in range(5):
        scheduler.add(make_request(i, [10 - i]))
    assert [batch[0].request.id for batch in drain(scheduler)] == [0, 1, 2, 3, 4]


def test_cancelled_requests_are_never_scheduled() -> None:
    scheduler = Scheduler(max_batch_tokens=100, max_batch_size=8)
    kept, cancelled = make_request(0, [3, 3]), make_request(1, [3, 3])
    scheduler.add(cancelled)
    scheduler.add(kept)
    cancelled.is_cancelled = True
    ids = {item.request.id for batch in drain(scheduler) for item in batch}
    assert ids == {0}


def test_an_input_as_long_as_the_budget_gets_a_batch_of_its_own() -> None:
    scheduler = Scheduler(max_batch_tokens=16, max_batch_size=8)
    scheduler.add(make_request(0, [16, 1, 1]))
    batches = drain(scheduler)
    assert [[item.length for item in batch] for batch in batches] == [[1, 1], [16]]


def test_pending_request_slices_its_inputs() -> None:
    request = make_request(0, [2, 3, 1])
    assert request.input_ids(0).tolist() == [0, 1]
    assert request.input_ids(1).tolist() == [2, 3, 4]
    assert request.input_ids(2).tolist() == [5]
    assert request.remaining == 3


def brute_force_cost(lengths: list[int], overhead: float, max_size: int, max_tokens: int) -> float:
    """The cheapest cut of sorted lengths, by trying every set of cut points."""
    best = float("inf")
    count = len(lengths)
    for mask in range(1 << (count - 1)):
        cuts = [0, *(i + 1 for i in range(count - 1) if mask >> i & 1), count]
        groups = [lengths[a:b] for a, b in itertools.pairwise(cuts)]
        if any(len(g) > max_size or (len(g) > 1 and len(g) * g[-1] > max_tokens) for g in groups):
            continue
        best = min(best, sum(overhead + len(g) * g[-1] for g in groups))
    return best


def cheapest_cut(lengths: list[int], overhead: float, max_size: int, max_tokens: int) -> list[list[WorkItem]]:
    """The scheduler's batches for one request of these sorted lengths, held to take every input once and to cost
    what the cheapest cut costs (brute_force_cost)."""
    scheduler = Scheduler(max_batch_tokens=max_tokens, max_batch_size=max_size, batch_overhead_tokens=overhead)
    scheduler.add(make_request(0, lengths))
    batches = scheduler.next_batches()
    assert sorted(item.length for b in batches for item in b) == lengths
    cost = sum(overhead + len(b) * max(item.length for item in b) for b in batches)
    assert cost == pytest.approx(brute_force_cost(lengths, overhead, max_size, max_tokens))
    return batches


@pytest.mark.parametrize("seed", range(20))
def test_batches_are_the_cheapest_cut_of_the_window(seed: int) -> None:
    rng = np.random.default_rng(seed)
    lengths = sorted(int(n) for n in rng.integers(1, 60, size=int(rng.integers(1, 11))))
    overhead = float(rng.choice([0.0, 10.0, 40.0, 120.0]))
    cheapest_cut(lengths, overhead, 4, 150)


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize("margin", [-1.0, 0.0, 1.0])
def test_a_window_whose_padding_costs_about_a_pass_is_cut_as_cheaply_as_any_cut(seed: int, margin: float) -> None:
    """Around the point where one batch's padding costs what a pass costs (where the scheduler stops
    keeping the window whole without running its program), the cut is still the cheapest."""
    rng = np.random.default_rng(seed)
    lengths = sorted(int(n) for n in rng.integers(1, 30, size=int(rng.integers(2, 9))))
    overhead = len(lengths) * lengths[-1] - sum(lengths) + margin
    batches = cheapest_cut(lengths, overhead, 8, 400)
    if margin > 0:
        assert len(batches) == 1


@pytest.mark.parametrize("seed", range(30))
def test_a_window_within_the_caps_is_cut_at_length_changes_as_cheaply_as_any_cut(seed: int) -> None:
    """A window no cap can bind, of few distinct lengths (single sentences), is planned over its runs of equal
    lengths only (Scheduler._cut_at_run_ends): still the cheapest cut of all, runs split or not."""
    rng = np.random.default_rng(seed)
    values = rng.integers(1, 40, size=int(rng.integers(1, 5)))
    lengths = sorted(int(n) for n in rng.choice(values, size=int(rng.integers(2, 12))))
    overhead = float(rng.choice([0.0, 1.0, 5.0, 20.0, 60.0]))
    cheapest_cut(lengths, overhead, 64, 10_000)


@pytest.mark.parametrize("seed", range(10))
def test_a_pass_worth_a_whole_batch_gets_the_fewest_batches_within_the_caps(seed: int) -> None:
    """Where a pass costs at least a batch's token budget (a GPU bound by its launches), the window
    is filled to the caps: as few passes as any cut allows, none over a cap."""
    rng = np.random.default_rng(seed)
    lengths = sorted(int(n) for n in rng.integers(1, 60, size=int(rng.integers(1, 11))))
    scheduler = Scheduler(max_batch_tokens=150, max_batch_size=4, batch_overhead_tokens=150)
    scheduler.add(make_request(0, lengths))
    batches = scheduler.next_batches()
    assert sorted(item.length for b in batches for item in b) == lengths
    assert all(len(b) <= 4 and (len(b) == 1 or len(b) * max(i.length for i in b) <= 150) for b in batches)
    # with a huge overhead the cheapest cut is the one with the fewest batches
    fewest = brute_force_cost(lengths, 1e9, 4, 150) // 1e9
    assert len(batches) == fewest


def test_a_costly_forward_pass_keeps_one_batch_and_a_cheap_one_splits_by_length() -> None:
    lengths = [10] * 8 + [40] * 8
    cheap = Scheduler(max_batch_tokens=10_000, max_batch_size=64, batch_overhead_tokens=5)
    cheap.add(make_request(0, lengths))
    assert [len(b) for b in cheap.next_batches()] == [8, 8]
    costly = Scheduler(max_batch_tokens=10_000, max_batch_size=64, batch_overhead_tokens=1000)
    costly.add(make_request(0, lengths))
    assert [len(b) for b in costly.next_batches()] == [16]
