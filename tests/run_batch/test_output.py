"""The output file: an unfinished last line cut off on reopening, lines appended in input order."""

from __future__ import annotations

from pathlib import Path

import pytest

from run_batch.output import OrderedOutput, recover


def test_unfinished_last_line_is_cut_off_and_the_last_complete_one_reported(tmp_path: Path) -> None:
    path = tmp_path / "out.jsonl"
    path.write_bytes(b'{"index":0}\n{"index":1}\n{"index":2,"embed')
    existing = recover(path)
    assert (existing.lines, existing.last, existing.cut) == (2, b'{"index":1}', len(b'{"index":2,"embed'))
    assert path.read_bytes() == b'{"index":0}\n{"index":1}\n'


def test_complete_file_is_left_as_it_is(tmp_path: Path) -> None:
    path = tmp_path / "out.jsonl"
    path.write_bytes(b"a\nb\n")
    assert (recover(path).lines, recover(path).last, recover(path).cut) == (2, b"b", 0)
    assert recover(tmp_path / "missing.jsonl").lines == 0


def test_last_line_is_found_across_read_chunks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "out.jsonl"
    lines = [f"line {i} ".encode() * (i % 5 + 1) for i in range(200)]
    path.write_bytes(b"\n".join(lines) + b"\npartial")
    for chunk in (1, 7, 64, 1 << 20):
        monkeypatch.setattr("run_batch.output.CHUNK", chunk)
        existing = recover(path)
        assert (existing.lines, existing.last) == (200, lines[-1])


def test_units_finishing_out_of_order_are_written_in_order(tmp_path: Path) -> None:
    path = tmp_path / "out.jsonl"
    output = OrderedOutput(path, 0)
    assert output.put(1, [b"b1\n", b"b2\n"]) == 0
    assert output.put(2, [b"c\n"]) == 0
    assert output.put(0, [b"a\n"]) == 4
    output.close()
    assert path.read_bytes() == b"a\nb1\nb2\nc\n"
