"""The output file: an unfinished last line cut off on reopening, lines appended in input order."""

from __future__ import annotations

from pathlib import Path

import pytest

from run_batch.output import OrderedOutput, default_errors_path, recover, recover_errors


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


def test_errors_go_to_their_file_in_input_order_before_their_output_lines(tmp_path: Path) -> None:
    path, errors = tmp_path / "out.jsonl", tmp_path / "out.errors.jsonl"
    output = OrderedOutput(path, 0, errors)
    assert output.put(1, [b"b\n"], [b'{"index":1}\n']) == 0
    assert errors.read_bytes() == b""  # unit 1 waits for unit 0, its error with it
    assert output.put(0, [b"a\n"], [b'{"index":0}\n']) == 2
    output.close()
    assert errors.read_bytes() == b'{"index":0}\n{"index":1}\n'
    assert default_errors_path(tmp_path / "answers.jsonl") == tmp_path / "answers.errors.jsonl"


def test_a_resumed_job_keeps_the_errors_of_the_items_output_answers(tmp_path: Path) -> None:
    errors = tmp_path / "out.errors.jsonl"
    # Item 5's error was written, its output line was not (killed between the two); the last write was cut short.
    errors.write_bytes(b'{"line":2,"index":1}\n{"line":7,"index":5}\n{"line":9,"ind')
    recover_errors(errors, 5)
    assert errors.read_bytes() == b'{"line":2,"index":1}\n'
    recover_errors(errors, 0)  # a new job: OUTPUT was removed
    assert errors.read_bytes() == b""
    recover_errors(tmp_path / "missing.jsonl", 3)
    assert not (tmp_path / "missing.jsonl").exists()
