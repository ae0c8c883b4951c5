"""tests/scheduling.py: under `--dist loadscope` the end-to-end modules are one unit, every other module its own."""

from __future__ import annotations

from collections import OrderedDict

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


def test_the_units_that_start_processes_are_dealt_first_each_folder_in_loadscope_s_order(
    two_workers: pytest.Config,
) -> None:
    scheduler = SharedLaunchScheduling(two_workers)
    # loadscope's order: the scopes with the most tests first
    loadscope = [
        "tests/apiserver/requests/test_tokenizer.py", "tests/in_process/test_schema_fuzz.py", "tests/e2e/",
        "tests/engine_core/test_pooling.py", "tests/fidelity/test_served.py", "tests/in_process/test_priority.py",
        "tests/bench/test_cpu_race.py", "tests/supervisor/test_arbiter.py", "tests/test_alone.py",
    ]  # fmt: skip
    scheduler.workqueue = OrderedDict((scope, {f"{scope}::test": False}) for scope in loadscope)
    scheduler.order_queue()
    assert list(scheduler.workqueue) == [
        "tests/e2e/", "tests/bench/test_cpu_race.py", "tests/in_process/test_schema_fuzz.py",
        "tests/in_process/test_priority.py", "tests/fidelity/test_served.py", "tests/supervisor/test_arbiter.py",
        "tests/apiserver/requests/test_tokenizer.py", "tests/engine_core/test_pooling.py", "tests/test_alone.py",
    ]  # fmt: skip
    assert scheduler.workqueue["tests/e2e/"] == {"tests/e2e/::test": False}


def test_another_dist_mode_keeps_xdist_s_own_scheduler(
    two_workers: pytest.Config, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(two_workers.option, "dist", "load")
    assert make_scheduler(two_workers, None) is None
    monkeypatch.setattr(two_workers.option, "dist", "loadscope")
    assert isinstance(make_scheduler(two_workers, None), SharedLaunchScheduling)
