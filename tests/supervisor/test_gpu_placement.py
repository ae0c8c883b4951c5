"""Which GPU each engine gets (supervisor/gpu_placement.py): the plan, as a pure function of the models' --device,
their engine counts and the GPUs seen; no GPU needed. That the arbiter hands each engine its plan's
CUDA_VISIBLE_DEVICES: test_placement_reaches_each_engine_s_environment, on stub children."""

from __future__ import annotations

from pathlib import Path

import pytest

from poolserve.config import Config, ConfigError
from supervisor.arbiter import EXIT_START_FAILED
from supervisor.children import CUDA_DEVICES_ENV, gpu_names
from supervisor.gpu_placement import PlacedModel, PlacementError, place_engines
from tests.supervisor.stubs import Run


def model(name: str, device: str = "auto", engines: int = 1) -> PlacedModel:
    config = Config(device=device, engine_count=engines)
    return PlacedModel(name, config.device_kind, config.gpu_indexes, engines)


@pytest.mark.parametrize(
    ("engines", "visible", "gpus"),
    [
        (1, ["0", "1"], [None]),  # one engine: the supervisor's own CUDA_VISIBLE_DEVICES, as ever
        (2, ["0", "1"], ["0", "1"]),
        (3, ["2", "5"], ["2", "5", "2"]),
        (2, ["GPU-abc", "GPU-def"], ["GPU-abc", "GPU-def"]),
        (2, [], ["0", "1"]),  # no GPU seen: engine i is told GPU i, which nothing reads
    ],
)
def test_engine_i_of_one_model_gets_the_i_th_visible_gpu_wrapping_round(
    engines: int, visible: list[str], gpus: list[str | None]
) -> None:
    assert place_engines([model("m", engines=engines)], visible).gpus == gpus


def test_without_cuda_visible_devices_the_gpus_are_those_the_driver_lists(tmp_path: Path) -> None:
    for bus in ("0000:18:00.0", "0000:2a:00.0"):  # /proc/driver/nvidia/gpus/ holds one folder per GPU
        (tmp_path / bus).mkdir()
    assert gpu_names(None, tmp_path) == ["0", "1"]
    assert gpu_names("", tmp_path) == ["0", "1"]
    assert gpu_names("7", tmp_path) == ["7"]  # the variable, when set, is what counts
    assert gpu_names(None, tmp_path / "no-driver") == []


def test_each_model_s_engines_go_to_the_gpus_it_names() -> None:
    plan = place_engines(
        [model("embed", "cuda:0", engines=2), model("rerank", "cuda:1,2", engines=3)], ["GPU-a", "GPU-b", "GPU-c"]
    )
    assert plan.gpus == ["GPU-a", "GPU-a", "GPU-b", "GPU-c", "GPU-b"]
    assert plan.warnings == [
        "GPU GPU-a holds 2 engines, engine-0 ('embed'), engine-1 ('embed'): each a copy of its model, sharing the "
        "GPU's memory and compute",
        "GPU GPU-b holds 2 engines, engine-2 ('rerank'), engine-4 ('rerank'): each a copy of its model, sharing the "
        "GPU's memory and compute",
    ]


def test_models_that_name_no_gpu_go_round_the_gpus_no_model_names() -> None:
    plan = place_engines(
        [model("embed", engines=2), model("rerank", "cuda:0"), model("clip", "cuda", engines=2)], ["0", "1", "2"]
    )
    assert plan.gpus == ["1", "2", "0", "1", "2"]
    assert len(plan.warnings) == 2  # GPUs 1 and 2 each hold an embed and a clip engine
    # Every GPU named: the others share all of them.
    assert place_engines([model("a", "cuda:0,1"), model("b")], ["0", "1"]).gpus == ["0", "0"]


def test_models_apart_on_enough_gpus_get_no_warning_and_cpu_engines_no_gpu() -> None:
    plan = place_engines([model("embed", "cuda:0"), model("rerank", "cuda:1"), model("cpu", "cpu")], ["0", "1"])
    assert plan == (["0", "1", None], [])
    # Two models on one GPU: the warning --engine-count gives engines that share one, naming both models.
    (warning,) = place_engines([model("embed"), model("rerank")], ["0"]).warnings
    assert warning.startswith("GPU 0 holds 2 engines, engine-0 ('embed'), engine-1 ('rerank')"), warning


@pytest.mark.parametrize(
    ("visible", "words"),
    [(["0", "1"], "there is no GPU 2: the 2 visible are 0, 1"), ([], "there is no GPU 0: no GPU is visible")],
)
def test_a_gpu_index_beyond_those_visible_is_refused_in_one_sentence(visible: list[str], words: str) -> None:
    with pytest.raises(PlacementError, match=words) as refused:
        place_engines([model("embed"), model("rerank", "cuda:0,2")], visible)
    assert str(refused.value).startswith("model 'rerank' has --device cuda:0,2, but ")
    assert str(refused.value).count(". ") == 0


@pytest.mark.parametrize("device", ["gpu", "cuda:", "cuda:x", "cuda:1,1", "cpu:0", "auto:1", "cuda:-1", "cuda:\u0661"])
def test_a_device_that_is_not_auto_cpu_cuda_or_gpu_indexes_is_refused(device: str) -> None:
    with pytest.raises(ConfigError, match=rf"^--device has value {device!r}; give auto, cpu, cuda, or cuda:I"):
        Config(device=device)


def test_a_device_s_kind_and_indexes() -> None:
    assert (Config(device="cuda:1,0").device_kind, Config(device="cuda:1,0").gpu_indexes) == ("cuda", [1, 0])
    assert (Config(device="cuda").device_kind, Config(device="cuda").gpu_indexes) == ("cuda", [])
    assert (Config().device_kind, Config(device="cpu").device_kind) == ("auto", "cpu")
    with pytest.raises(ConfigError, match="int8 is a CPU mode"):
        Config(device="cuda:0", dtype="int8")


def visible_gpu(pid: int) -> str | None:
    """A live process's CUDA_VISIBLE_DEVICES."""
    for entry in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"):
        name, _, value = entry.decode().partition("=")
        if name == CUDA_DEVICES_ENV:
            return value
    return None


def test_placement_reaches_each_engine_s_environment(stubs: Run, monkeypatch: pytest.MonkeyPatch) -> None:
    """The real supervisor with stub engines on two "GPUs": embed named the second, rerank's two engines the first,
    and the warning names the GPU they share."""
    monkeypatch.setenv(CUDA_DEVICES_ENV, "GPU-a,GPU-b")
    embed = Config(api_server_count=1, port=0, served_model_name=["embed"], device="cuda:1")
    rerank = Config(api_server_count=1, port=0, served_model_name=["rerank"], device="cuda:0", engine_count=2)
    stubs.supervise(embed, [embed, rerank])
    seen: dict[str, str | None] = {}

    def scenario(run: Run) -> None:
        run.wait_started()
        for name in ("engine-0", "engine-1", "engine-2"):
            (pid,) = run.pids(name)
            seen[name] = visible_gpu(pid)

    stubs.run(scenario)
    assert seen == {"engine-0": "GPU-b", "engine-1": "GPU-a", "engine-2": "GPU-a"}
    assert "GPU GPU-a holds 2 engines, engine-1 ('rerank'), engine-2 ('rerank')" in stubs.log()


def test_a_model_that_names_a_missing_gpu_stops_the_start_with_its_sentence(
    stubs: Run, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(CUDA_DEVICES_ENV, "0")
    embed = Config(api_server_count=1, port=0, served_model_name=["embed"])
    rerank = Config(api_server_count=1, port=0, served_model_name=["rerank"], device="cuda:1")
    stubs.supervise(embed, [embed, rerank])
    assert stubs.run() == EXIT_START_FAILED
    assert stubs.stderr.strip() == (
        "poolserve: could not start: model 'rerank' has --device cuda:1, but there is no GPU 1: the 1 visible are 0 "
        "(CUDA_VISIBLE_DEVICES, else the NVIDIA driver's list, numbered from 0)."
    )
    assert stubs.events() == []  # refused before any child started
