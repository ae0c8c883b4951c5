"""`launch run-batch`'s flags: its own, then launch's, handed to the job's server as given."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from run_batch.cli import build_parser, split_argv
from supervisor.cli import build_parser as build_launch_parser
from supervisor.cli import main as launch


def test_launch_flags_are_forwarded_as_given_and_the_job_flags_kept() -> None:
    job, forwarded = split_argv(["-i", "in.jsonl", "--dtype", "float32", "--output", "out.jsonl", "--model", "m"])
    assert (str(job.input), str(job.output)) == ("in.jsonl", "out.jsonl")
    assert forwarded == ["--dtype", "float32", "--model", "m"]


def test_the_job_server_listens_on_no_address_the_user_picks(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        build_parser().parse_args(["-i", "a", "-o", "b", "--port", "9000"])
    assert exit_.value.code == 2
    assert "unrecognized arguments: --port 9000" in capsys.readouterr().err


def test_launch_help_names_run_batch() -> None:
    assert "launch run-batch --input FILE --output FILE" in build_launch_parser().format_help()


def test_output_of_another_input_is_refused_before_a_server_starts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Through `launch`'s own main, as `launch run-batch` runs it (the jobs that start a server: tests/e2e/
    test_run_batch.py)."""
    source = tmp_path / "texts.jsonl"
    source.write_text(json.dumps("one") + "\n" + json.dumps("two") + "\n")
    output = tmp_path / "out.jsonl"
    output.write_text(json.dumps({"custom_id": "x", "response": None}) + "\n")
    with pytest.raises(SystemExit) as caught:
        launch(["run-batch", "--input", str(source), "--output", str(output)])
    assert caught.value.code == 2
    assert "does not continue this input" in capsys.readouterr().err
