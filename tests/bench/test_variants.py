"""bench.variants' reading of a variant: checkout, environment and launch flags."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.harness.server_process import REPO
from bench.variants import split_variant


def test_a_plain_variant_is_launch_flags_on_this_checkout() -> None:
    assert split_variant("--dtype float32 --max-batch-size 64") == (
        REPO,
        {},
        ["--dtype", "float32", "--max-batch-size", "64"],
    )
    assert split_variant("") == (REPO, {}, [])


def test_a_checkout_and_environment_variables_lead_the_flags_in_any_order() -> None:
    cwd, env, flags = split_variant("env=OMP_WAIT_POLICY=PASSIVE cwd=/tmp/before env=GOMP_SPINCOUNT=0 --dtype float32")
    assert cwd == Path("/tmp/before")
    assert env == {"OMP_WAIT_POLICY": "PASSIVE", "GOMP_SPINCOUNT": "0"}
    assert flags == ["--dtype", "float32"]
    # A value may hold '=' and be empty; only the leading words are read as such.
    assert split_variant("env=A=b=c env=EMPTY= --flag env=X=1")[1:] == (
        {"A": "b=c", "EMPTY": ""},
        ["--flag", "env=X=1"],
    )


def test_an_environment_word_without_a_value_is_refused_by_name() -> None:
    with pytest.raises(SystemExit, match="env=NAME=VALUE"):
        split_variant("env=OMP_WAIT_POLICY --dtype float32")
