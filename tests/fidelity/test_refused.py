"""Every refused layout of docs/models.md stops the engine at start with its documented sentence, and `launch`
exits with its boot-error code printing it."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.harness.server_process import PoolserveProcess
from engine_core.folder_choices import LoadError
from poolserve.boot import EXIT_BOOT_ERROR
from tests.fidelity.layouts import REFUSED, Refused, build_dense_chain_with_prompts, build_include_prompt_false
from tests.fidelity.stack import load
from tests.utils import FLOAT32_CPU


@pytest.mark.parametrize("layout", REFUSED, ids=[case.id for case in REFUSED])
def test_the_layout_is_refused_at_start_with_its_documented_sentence(layout: Refused, tmp_path: Path) -> None:
    folder = tmp_path / layout.id
    layout.build(folder)
    with pytest.raises(LoadError) as refused:
        load(folder, **layout.flags)
    assert layout.message in str(refused.value)


@pytest.mark.e2e
def test_launch_exits_at_start_naming_what_it_refuses(tmp_path: Path) -> None:
    """The engine's refusal reaches the operator as `launch`'s one line, whatever the layout (the path from
    LoadError to the exit is the same for all of them, and for a --model that is no folder at all:
    tests/engine_core/test_loader.py)."""
    layout = next(case for case in REFUSED if case.id == "causal-lm-without-st-files")
    folder = tmp_path / layout.id
    layout.build(folder)
    launched = PoolserveProcess("--model", str(folder), "--api-server-count", "1", *FLOAT32_CPU)
    try:
        assert launched.wait_exit(60) == EXIT_BOOT_ERROR, launched.log()
        lines = [line for line in launched.stderr().splitlines() if line.startswith("poolserve: could not start")]
        assert len(lines) == 1 and layout.message in lines[0], launched.log()
        assert "ready" not in launched.stdout()
    finally:
        launched.stop()


def test_pooling_overridden_under_the_folders_heads_is_refused(tmp_path: Path) -> None:
    """The Dense modules read the folder's pooled width; another pooling would feed them something else."""
    folder = tmp_path / "heads"
    build_dense_chain_with_prompts(folder)  # mean pooling, then Dense modules
    with pytest.raises(LoadError, match=r"--pooling cls replaces the folder's Pooling \(mean\)"):
        load(folder, pooling="cls")


def test_pooling_overridden_on_a_folder_that_leaves_its_prompt_out_is_refused(tmp_path: Path) -> None:
    folder = tmp_path / "instructor"
    build_include_prompt_false(folder)
    with pytest.raises(LoadError, match=r"leaves the prompt's tokens out \(include_prompt false\); drop --pooling"):
        load(folder, pooling="mean")
