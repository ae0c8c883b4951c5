"""tests/scheduling.py: under `--dist loadscope` the end-to-end modules are one unit, every other module its own."""

from __future__ import annotations

import pytest

from tests.scheduling import SharedLaunchScheduling, make_scheduler


@pytest.fixture
def two_workers(pytestconfig: pytest.Config, monkeypatch: pytest.MonkeyPatch) -> pytest.Config:
    """The suite's config as the controlling process has it under `-n 2`: xdist turns it into two `popen`
    execution nodes, which the scheduler counts."""
    monkeypatch.setattr(pytestconfig.option, "tx", ["2*popen"])
    return pytestconfig


def test_the_end_to_end_modules_are_one_scope_and_every_other_module_its_own(two_workers: pytest.Config) -> None:
    scheduler = SharedLaunchScheduling(two_workers)
    scopes = {
        nodeid: scheduler._split_scope(nodeid)
        for nodeid in (
            "tests/e2e/test_faults.py::test_a_killed_engine_is_restarted_and_no_request_fails",
            "tests/e2e/test_metrics.py::test_restarts_are_counted[engine]",
            "tests/in_process/test_slow_clients.py::test_a_slow_client_within_the_timeouts_is_served",
            "tests/in_process/test_slow_clients.py::test_a_header_timeout[1]",
            "tests/test_alone.py::test_plain_tests_run_side_by_side",
        )
    }
    assert list(scopes.values()) == [
        "tests/e2e/",
        "tests/e2e/",
        "tests/in_process/test_slow_clients.py",
        "tests/in_process/test_slow_clients.py",
        "tests/test_alone.py",
    ]


def test_another_dist_mode_keeps_xdist_s_own_scheduler(
    two_workers: pytest.Config, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(two_workers.option, "dist", "load")
    assert make_scheduler(two_workers, None) is None
    monkeypatch.setattr(two_workers.option, "dist", "loadscope")
    assert isinstance(make_scheduler(two_workers, None), SharedLaunchScheduling)
