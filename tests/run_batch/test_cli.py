"""`launch run-batch`'s flags: its own, then launch's, handed to the job's server as given."""

from __future__ import annotations

import pytest

from run_batch.cli import build_parser, split_argv
from supervisor.cli import build_parser as build_launch_parser


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
