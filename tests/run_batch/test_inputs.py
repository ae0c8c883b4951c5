"""Input files read as items: OpenAI batch lines, texts from JSONL, CSV and Parquet, bad lines kept as items."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from run_batch.inputs import InputError, Request, Text, count_items, detect_format, read_items


def test_openai_lines_keep_their_body_bytes_and_bad_lines_their_line_number(tmp_path: Path) -> None:
    path = tmp_path / "batch.jsonl"
    good = '{"custom_id": "a", "method": "POST", "url": "/v1/embeddings", "body": {"input":  "x"}}'
    path.write_text(f"{good}\n\n{{broken\n" + json.dumps({"custom_id": "b", "method": "POST", "url": "v1", "body": {}}))
    assert detect_format(path, "auto") == "openai"
    items = list(read_items(path, "openai", "text", None))
    assert count_items(path, "openai") == len(items) == 3
    first, broken, bad_url = items
    assert isinstance(first, Request) and first.body == b'{"input":  "x"}' and first.problem is None
    assert broken.index == 1 and broken.line == 3 and broken.problem and broken.problem.startswith("line 3:")
    assert isinstance(bad_url, Request) and bad_url.custom_id == "b" and "is not a path" in (bad_url.problem or "")


def test_jsonl_texts_are_strings_or_objects(tmp_path: Path) -> None:
    path = tmp_path / "texts.jsonl"
    path.write_text('"plain"\n{"text": "in an object", "id": 7}\n{"text": 3}\n[1]\n')
    assert detect_format(path, "auto") == "jsonl"
    items = list(read_items(path, "jsonl", "text", "id"))
    assert [(t.text, t.id) for t in items[:2]] == [("plain", None), ("in an object", 7)]
    assert "'text' is of type int" in (items[2].problem or "") and "line 4" in (items[3].problem or "")


def test_csv_texts_with_an_id_column(tmp_path: Path) -> None:
    path = tmp_path / "texts.csv"
    path.write_text('id,body\n1,"one, with a comma"\n2,"two\nlines"\n3,three\n')
    items = list(read_items(path, detect_format(path, "auto"), "body", "id"))
    assert count_items(path, "csv") == 3
    assert [(t.id, t.text, t.line) for t in items if isinstance(t, Text)] == [
        ("1", "one, with a comma", 2),
        ("2", "two\nlines", 4),
        ("3", "three", 5),
    ]
    with pytest.raises(InputError, match="no column 'text'"):
        list(read_items(path, "csv", "text", None))


def test_parquet_texts(tmp_path: Path) -> None:
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    path = tmp_path / "texts.parquet"
    pq.write_table(pa.table({"text": ["a", None, "c"], "doc": [10, 11, 12]}), path)
    items = list(read_items(path, detect_format(path, "auto"), "text", "doc"))
    assert count_items(path, "parquet") == 3
    assert [(t.index, t.id, t.text) for t in items if t.problem is None] == [(0, 10, "a"), (2, 12, "c")]
    assert items[1].problem == "line 2: 'text' is missing"
