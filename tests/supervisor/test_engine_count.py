from __future__ import annotations

import pytest

import poolserve.config
from poolserve.boot import ChildSpec, child_name
from supervisor.cli import parse_config


def test_one_engine_is_the_default_and_keeps_torch_s_own_thread_count() -> None:
    config = parse_config([])
    assert config.engine_count == 1
    assert config.engine_torch_threads == 0
    assert child_name("engine", 0, config.engine_count) == "engine"


def test_several_engines_share_the_usable_cores_unless_torch_threads_is_given(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(poolserve.config, "usable_cores", lambda: 8)
    assert parse_config(["--engine-count", "2"]).engine_torch_threads == 4
    assert parse_config(["--engine-count", "3"]).engine_torch_threads == 2
    assert parse_config(["--engine-count", "16"]).engine_torch_threads == 1
    assert parse_config(["--engine-count", "2", "--torch-threads", "3"]).engine_torch_threads == 3


def test_each_engine_has_its_own_endpoint_and_name() -> None:
    one = ChildSpec(role="api", config=parse_config([]), runtime_dir="/run/p", boot_fd=3, supervisor_pid=1)
    assert one.engine_endpoints == ["ipc:///run/p/engine.sock"]
    config = parse_config(["--engine-count", "3"])
    spec = ChildSpec(role="api", config=config, runtime_dir="/run/p", boot_fd=3, supervisor_pid=1)
    assert spec.engine_endpoints == [
        "ipc:///run/p/engine-0.sock",
        "ipc:///run/p/engine-1.sock",
        "ipc:///run/p/engine-2.sock",
    ]
    assert [child_name("engine", i, 3) for i in range(3)] == ["engine-0", "engine-1", "engine-2"]
