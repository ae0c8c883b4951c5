from __future__ import annotations

from engine_core.admission import LESS_URGENT_SHARE, AdmissionLimit


def test_less_urgent_work_gets_refused_first_when_the_queue_is_nearly_full() -> None:
    limit = AdmissionLimit(max_inputs=100, max_tokens=10_000)
    assert limit.try_admit(int(100 * LESS_URGENT_SHARE) - 10, 10)
    assert not limit.try_admit(20, 10, priority=1)  # past the share bulk work may fill
    assert limit.try_admit(20, 10, priority=0)  # urgent work has the rest
    assert limit.try_admit(10, 10, priority=-5)
    assert not limit.try_admit(1, 1, priority=-5)  # the limit itself holds for everyone


def test_on_an_empty_queue_less_urgent_work_may_use_the_whole_limit() -> None:
    limit = AdmissionLimit(max_inputs=100, max_tokens=10_000)
    assert limit.try_admit(95, 10, priority=3)  # else a request this big would get 429 forever
