from __future__ import annotations

from pathlib import Path

import pytest

import poolserve.config
from poolserve.boot import ChildSpec, child_name
from supervisor.children import engine_gpu, gpu_names
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


@pytest.mark.parametrize(
    ("index", "visible", "gpu"),
    [
        (0, None, "0"),
        (1, None, "1"),
        (1, "2,5", "5"),
        (2, "2,5", "2"),
        (0, "GPU-abc, GPU-def", "GPU-abc"),
        (1, "", "1"),
    ],
)
def test_engine_i_gets_the_i_th_visible_gpu(index: int, visible: str | None, gpu: str, tmp_path: Path) -> None:
    assert engine_gpu(index, visible, driver_dir=tmp_path / "no-driver") == gpu


def test_without_cuda_visible_devices_engines_wrap_round_the_gpus_the_driver_lists(tmp_path: Path) -> None:
    for bus in ("0000:18:00.0", "0000:2a:00.0"):  # /proc/driver/nvidia/gpus/ holds one folder per GPU
        (tmp_path / bus).mkdir()
    assert gpu_names(None, tmp_path) == ["0", "1"]
    assert [engine_gpu(index, None, tmp_path) for index in range(3)] == ["0", "1", "0"]
    assert [engine_gpu(index, "", tmp_path) for index in range(3)] == ["0", "1", "0"]
    assert engine_gpu(2, "7", tmp_path) == "7"  # the variable, when set, is what counts
