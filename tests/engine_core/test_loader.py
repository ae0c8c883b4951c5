from __future__ import annotations

import json
import time
from collections.abc import Sequence
from pathlib import Path

import huggingface_hub.constants
import numpy as np
import numpy.typing as npt
import pytest

from engine_core.load_model import load_model
from engine_core.loader import LoadError, measure_batch_overhead, resolve_model_folder
from poolserve.config import Config


class TimedRunner:
    """Takes `overhead` seconds per forward pass plus `per_token` per token: a known cost model, on a clock of its
    own (measure_batch_overhead reads time.perf_counter; a real sleep's wake-up jitter on a loaded host is as large
    as the costs these tests tell apart)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, overhead: float, per_token: float):
        self.overhead, self.per_token, self.now = overhead, per_token, 0.0
        monkeypatch.setattr(time, "perf_counter", lambda: self.now)

    def run_texts(self, rows: Sequence[npt.NDArray[np.int32]], type_rows: object) -> npt.NDArray[np.float32]:
        self.now += self.overhead + self.per_token * sum(len(row) for row in rows)
        return np.zeros((len(rows), 4), dtype=np.float32)

    def run_images(self, pixels: npt.NDArray[np.uint8]) -> npt.NDArray[np.float32]:
        raise TypeError


def test_the_measured_overhead_is_the_forward_pass_cost_in_tokens(monkeypatch: pytest.MonkeyPatch) -> None:
    runner = TimedRunner(monkeypatch, overhead=0.004, per_token=0.00002)  # a pass costs as much as 200 tokens
    overhead = measure_batch_overhead(runner, np.arange(10, dtype=np.int32), max_model_len=256)
    assert overhead == pytest.approx(200)


def test_a_pass_whose_cost_does_not_grow_with_its_tokens_is_worth_a_whole_batch(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A GPU running a small model is bound by its launches: a batch of 16 costs what one input does.
    The scheduler must then cut the biggest batches it can, not one per length (what 0 would say)."""
    runner = TimedRunner(monkeypatch, overhead=0.004, per_token=0.0)
    assert measure_batch_overhead(runner, np.arange(10, dtype=np.int32), max_model_len=256, cap=32768) == 32768
    # and a measured overhead above a batch's whole token budget weighs the same as that budget
    heavy = TimedRunner(monkeypatch, overhead=0.02, per_token=1e-8)  # a pass costs as much as 2,000,000 tokens
    assert measure_batch_overhead(heavy, np.arange(10, dtype=np.int32), max_model_len=256, cap=8192) == 8192


@pytest.mark.parametrize(
    ("saved", "bf16_gpu", "chosen"),
    [
        ("bfloat16", True, "bfloat16"),  # Qwen3-Embedding-8B, Gemma 3: float16 can overflow their activations
        ("bfloat16", False, "float32"),  # a GPU without bf16 (before Ampere): never float16 for them
        ("float32", True, "float16"),
        ("float16", True, "float16"),
        (None, True, "float16"),
    ],
)
def test_dtype_auto_on_cuda_keeps_a_bfloat16_trained_model_in_bfloat16(
    monkeypatch: pytest.MonkeyPatch, saved: str | None, bf16_gpu: bool, chosen: str
) -> None:
    import torch
    from transformers import BertConfig

    from engine_core.folder_choices import select_dtype

    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *args, **kwargs: bf16_gpu)
    config = BertConfig(dtype=saved) if saved else BertConfig()
    assert select_dtype("auto", torch.device("cuda"), config) == getattr(torch, chosen)
    assert select_dtype("auto", torch.device("cpu"), config) == torch.float32  # measured later: cpu_precision.py
    assert select_dtype("float16", torch.device("cuda"), config) == torch.float16  # the flag is the operator's


def hub_cache(root: Path, repo: str, revisions: dict[str, str]) -> None:
    """A Hugging Face cache as snapshot_download leaves it: a snapshot per commit, refs naming commits."""
    folder = root / f"models--{repo.replace('/', '--')}"
    for ref, commit in revisions.items():
        (folder / "refs").mkdir(parents=True, exist_ok=True)
        (folder / "refs" / ref).write_text(commit)
        snapshot = folder / "snapshots" / commit
        snapshot.mkdir(parents=True, exist_ok=True)
        (snapshot / "config.json").write_text(json.dumps({"ref": ref}))


def test_a_hub_id_resolves_to_the_cached_snapshot_of_its_revision(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    main, tagged = "a" * 40, "b" * 40
    hub_cache(tmp_path, "org/embedder", {"main": main, "v1": tagged})
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    assert resolve_model_folder("org/embedder").name == main
    assert resolve_model_folder("org/embedder", "v1").name == tagged
    assert resolve_model_folder("org/embedder", tagged).name == tagged
    with pytest.raises(LoadError, match="at revision 'v2'"):
        resolve_model_folder("org/embedder", "v2")


def test_a_revision_for_a_local_folder_is_refused_by_name(tmp_path: Path) -> None:
    with pytest.raises(LoadError, match=r"--revision picks a version of a hub id; --model .* is a local folder"):
        resolve_model_folder(str(tmp_path), "v1")
    with pytest.raises(LoadError, match="the bundled model has one version"):
        resolve_model_folder("", "v1")


def test_a_model_that_is_no_folder_and_not_on_the_hub_is_refused_in_one_line_naming_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The engine's side of `launch --model <missing>`: a LoadError, which its process reports at boot as every
    refusal is, and `launch` prints as one line and exits with (tests/fidelity/test_refused.py's launch)."""
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    missing = tmp_path / "no-such-model"
    with pytest.raises(LoadError) as refused:
        load_model(Config(model=str(missing), device="cpu", dtype="float32"))
    message = str(refused.value)
    assert f"--model {str(missing)!r} is not a folder and could not be fetched from the hub" in message
    assert "\n" not in message
