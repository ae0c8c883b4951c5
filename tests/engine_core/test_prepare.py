"""`launch prepare` (engine_core/prepare.py): what a start of the same flags caches, made before any start, so that the
first start serves through the graph from its first pass; a model or a graph that cannot be had fails the command."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from engine_core import loader
from engine_core.later_graph import LaterGraph
from engine_core.load_model import load_model
from engine_core.onnx_runtime import OnnxEncoder, graph_target
from engine_core.packed_graph import PACKED_NAME
from engine_core.prepare import prepare
from poolserve.config import Config
from tests.fidelity.layouts import tiny_bert


def launch(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    command = [sys.executable, "-m", "supervisor", *args]
    return subprocess.run(command, capture_output=True, text=True, env=env, timeout=240, check=False)


def test_launch_prepare_caches_the_graph_that_the_next_start_serves_through_from_its_first_pass(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder, cache = tiny_bert(tmp_path / "model", 11), tmp_path / "cache"
    done = launch("prepare", "--model", str(folder), "--dtype", "float32", "--onnx-cache-dir", str(cache))
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"{folder}: prepared in "), done.stdout
    assert "(BertModel, embedding, cpu float32)" in done.stdout
    # the loader's own lines say what it chose
    assert "ONNX graph of BertModel exported, optimised and packed in" in done.stderr
    assert "--runtime auto: the ONNX graph takes over from torch" in done.stderr
    assert graph_target(folder, "BertModel", cache).is_file()
    monkeypatch.setattr(loader, "has_avx512", lambda: False)  # the graph for every pass, whichever this host is
    with caplog.at_level(logging.INFO, logger="poolserve.engine"):
        loaded = load_model(Config(model=str(folder), device="cpu", dtype="float32", onnx_cache_dir=str(cache)))
    assert not isinstance(loaded.runner, LaterGraph)
    assert isinstance(loaded.runner.model, OnnxEncoder)  # type: ignore[attr-defined]
    assert "not cached yet" not in caplog.text


def test_launch_prepare_fails_with_the_model_and_the_reason(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    done = launch("prepare", "--model", str(tmp_path / "empty"), "--onnx-cache-dir", str(tmp_path / "cache"))
    assert done.returncode == 1, done.stderr
    assert done.stdout == ""
    assert done.stderr.splitlines()[-1].startswith(f"{tmp_path / 'empty'}: "), done.stderr
    usage = launch("prepare", "--dtype", "float64")
    assert usage.returncode == 2 and "launch prepare: error: argument --dtype" in usage.stderr, usage.stderr


def test_a_graph_that_fails_behind_torch_fails_the_prepare(tmp_path: Path) -> None:
    """Where a start would serve on through torch with a warning, prepare says the graph failed."""
    folder, cache = tiny_bert(tmp_path / "model", 12), tmp_path / "cache"
    in_the_way = graph_target(folder, "BertModel", cache).parent  # a file where the export would write the graph
    cache.mkdir()
    in_the_way.write_bytes(b"not a folder")
    with pytest.raises(RuntimeError, match=r"^the ONNX graph failed: "):
        prepare(Config(model=str(folder), device="cpu", dtype="float32", onnx_cache_dir=str(cache)))


def test_a_model_torch_serves_is_prepared_without_a_graph(tmp_path: Path) -> None:
    folder, cache = tiny_bert(tmp_path / "model", 13), tmp_path / "cache"
    said = prepare(Config(model=str(folder), device="cpu", dtype="float32", runtime="torch", onnx_cache_dir=str(cache)))
    assert said.startswith("prepared in ") and said.endswith("(BertModel, embedding, cpu float32)")
    assert not any(cache.glob(f"*/{PACKED_NAME}"))
