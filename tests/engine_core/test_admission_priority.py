from __future__ import annotations

from engine_core.admission import LESS_URGENT_SHARE, AdmissionLimit, engine_share


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


def test_the_engines_shares_sum_to_the_server_s_limit_and_differ_by_at_most_one() -> None:
    for total, count in ((4096, 1), (4096, 3), (7, 4), (262_144, 16), (1, 2)):
        shares = [engine_share(total, index, count) for index in range(count)]
        assert sum(shares) == total and max(shares) - min(shares) <= 1


def test_an_engine_admits_its_share_and_when_it_holds_nothing_any_request_within_the_whole_limit() -> None:
    limit = AdmissionLimit.for_engine(100, 10_000, index=1, count=2)
    assert (limit.max_inputs, limit.max_tokens) == (50, 5_000)
    assert limit.try_admit(90, 10)  # more than its share, but it held nothing: within the server's 100
    assert not limit.try_admit(1, 1)  # and then nothing more until it is released
    limit.release(90, 10)
    assert not limit.try_admit(101, 10)  # the API servers refuse such a request with 413 anyway
    assert limit.try_admit(30, 10)
    assert limit.try_admit(20, 10)  # the share: 50
    assert not limit.try_admit(1, 1)
