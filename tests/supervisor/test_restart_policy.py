"""The restart policy alone: a child's crash times and who else is up in, the supervisor's decision out."""

from __future__ import annotations

import pytest

from supervisor.restart_policy import (
    MAX_BACKOFF_S,
    Decision,
    GiveUp,
    Others,
    Restart,
    RestartPolicy,
    TakeOutOfService,
)


def crash_loop(
    policy: RestartPolicy, times: list[float], *, is_engine: bool = False, others: Others = Others.NONE
) -> list[Decision]:
    """The decision after each crash at `times`, the history kept as the arbiter keeps it."""
    history: list[float] = []
    decisions: list[Decision] = []
    for now in times:
        history = policy.recent([*history, now], now)
        decisions.append(policy.decide(history, now, is_engine=is_engine, others=others))
    return decisions


def test_the_first_crash_restarts_at_once_and_later_ones_back_off() -> None:
    decisions = crash_loop(RestartPolicy(window=60, limit=5), [0.0, 1.0, 2.0, 3.0, 4.0])
    assert decisions == [Restart(0.0, 1), Restart(0.5, 2), Restart(1.0, 3), Restart(2.0, 4), Restart(4.0, 5)]
    assert RestartPolicy().backoff(20) == MAX_BACKOFF_S


def test_crashes_outside_the_window_are_forgotten() -> None:
    policy = RestartPolicy(window=10, limit=5)
    decisions = crash_loop(policy, [0.0, 1.0, 2.0, 11.5, 100.0])
    # The ones at 0 and 1 fell out of the window by 11.5; all of them by 100.
    assert [decision.crashes for decision in decisions] == [1, 2, 3, 2, 1]
    assert policy.recent([0.0, 1.0, 2.0, 11.5], 11.5) == [2.0, 11.5]


def test_past_the_limit_an_api_server_makes_the_supervisor_give_up() -> None:
    decisions = crash_loop(RestartPolicy(window=60, limit=5), [float(t) for t in range(6)])
    assert decisions[-1] == GiveUp(6)
    # Whoever else is up: an API server's siblings serve as it does, so they are no reason to keep going.
    assert RestartPolicy(limit=1).decide([0.0, 1.0], 1.0, is_engine=False, others=Others.OWN_MODEL) == GiveUp(2)


@pytest.mark.parametrize("others", [Others.OWN_MODEL, Others.OTHER_MODELS])
def test_past_the_limit_an_engine_beside_others_that_are_up_is_taken_out_of_service(others: Others) -> None:
    policy = RestartPolicy(window=60, limit=5, out_of_service=300)
    decisions = crash_loop(policy, [float(t) for t in range(6)], is_engine=True, others=others)
    assert decisions[:5] == crash_loop(policy, [float(t) for t in range(5)])  # until then, as any child
    assert decisions[-1] == TakeOutOfService(300, 6, others)


def test_past_the_limit_an_engine_with_nobody_else_up_makes_the_supervisor_give_up() -> None:
    decisions = crash_loop(RestartPolicy(), [float(t) for t in range(6)], is_engine=True, others=Others.NONE)
    assert decisions[-1] == GiveUp(6)


def test_the_back_off_doubles_from_its_first_wait_up_to_its_ceiling() -> None:
    policy = RestartPolicy(first_backoff=0.1, max_backoff=0.5, limit=10)
    assert [policy.backoff(crashes) for crashes in range(1, 7)] == [0.0, 0.1, 0.2, 0.4, 0.5, 0.5]
