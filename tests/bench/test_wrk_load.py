"""bench.wrk_load's script: every body reaches wrk's Lua byte for byte."""

from __future__ import annotations

from pathlib import Path

from bench.harness.workloads import build_workload
from bench.wrk_load import lua_string, write_script


def test_a_lua_string_escapes_what_lua_would_read_otherwise() -> None:
    assert lua_string(b'{"a": "b\\c"}') == '"{\\034a\\034: \\034b\\092c\\034}"'
    # Three digits always: Lua reads up to three, so "\\34" before a digit would take it in.
    assert lua_string(b'"1') == '"\\0341"'
    assert lua_string("é\n".encode()) == '"\\195\\169\\010"'


def test_the_script_holds_every_body_of_the_workload_in_order(tmp_path: Path) -> None:
    workload = build_workload("rerank8")
    script = write_script(workload, tmp_path).read_text()
    positions = [script.index(lua_string(body)) for body in workload.bodies]
    assert positions == sorted(positions)
    assert lua_string(workload.path.encode()) in script and '"POST"' in script
