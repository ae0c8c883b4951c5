"""The job's input file read as items, one per output line: OpenAI batch requests, or texts from JSONL, CSV, Parquet.

Every item of the file becomes one output line, a bad one included (its `problem` says what is wrong
and where), so the n-th output line always answers the n-th item: that is what resuming relies on.
Blank lines are not items.
"""

from __future__ import annotations

import csv
import itertools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import msgspec

InputFormat = Literal["auto", "openai", "jsonl", "csv", "parquet"]
Format = Literal["openai", "jsonl", "csv", "parquet"]


class InputError(Exception):
    """The file as a whole cannot be read (missing, unknown format, no such column): the job does not start."""


class BatchLine(msgspec.Struct, forbid_unknown_fields=False):
    """One line of OpenAI's batch input file; the body stays the bytes the line holds."""

    custom_id: str
    method: str
    url: str
    body: msgspec.Raw


@dataclass(slots=True)
class Request:
    """An OpenAI batch line: POST `body` to `url`."""

    index: int
    line: int
    custom_id: str | None
    url: str = ""
    body: bytes = b""
    problem: str | None = None


@dataclass(slots=True)
class Text:
    """One text to embed, with the id the file gives it (if an id column was named)."""

    index: int
    line: int
    id: Any
    text: str = ""
    problem: str | None = None


Item = Request | Text
LINE_DECODER = msgspec.json.Decoder(BatchLine)


def detect_format(path: Path, requested: InputFormat) -> Format:
    if requested != "auto":
        return requested
    suffix = path.suffix.lower()
    if suffix == ".csv":
        return "csv"
    if suffix in (".parquet", ".pq"):
        return "parquet"
    with path.open("rb") as f:
        for raw in f:
            if raw.strip():
                try:
                    first = msgspec.json.decode(raw)
                except msgspec.DecodeError:
                    return "jsonl"
                is_request = isinstance(first, dict) and "custom_id" in first and "body" in first
                return "openai" if is_request else "jsonl"
    return "jsonl"


def read_items(path: Path, fmt: Format, text_column: str, id_column: str | None) -> Iterator[Item]:
    if fmt == "openai":
        return read_requests(path)
    if fmt == "jsonl":
        return read_jsonl_texts(path, text_column, id_column)
    if fmt == "csv":
        return read_csv_texts(path, text_column, id_column)
    return read_parquet_texts(path, text_column, id_column)


def count_items(path: Path, fmt: Format) -> int:
    """How many items the file holds (for the progress bar's total and ETA): a pass over it, or Parquet's footer."""
    if fmt == "parquet":
        return int(parquet_file(path).metadata.num_rows)
    if fmt == "csv":
        with path.open(newline="", encoding="utf-8") as f:
            return max(sum(1 for row in csv.reader(f) if row) - 1, 0)
    with path.open("rb") as f:
        return sum(1 for raw in f if raw.strip())


def nonblank_lines(path: Path) -> Iterator[tuple[int, bytes]]:
    with path.open("rb") as f:
        for number, raw in enumerate(f, start=1):
            if raw.strip():
                yield number, raw


def read_requests(path: Path) -> Iterator[Request]:
    for index, (number, raw) in enumerate(nonblank_lines(path)):
        yield parse_request(index, number, raw)


def parse_request(index: int, number: int, raw: bytes) -> Request:
    try:
        line = LINE_DECODER.decode(raw)
    except msgspec.DecodeError as exc:
        return Request(index, number, custom_id_of(raw), problem=f"line {number}: {exc}")
    if line.method.upper() != "POST":
        problem = f"line {number}: method {line.method!r} is not supported; a batch line is a POST"
        return Request(index, number, line.custom_id, problem=problem)
    if not line.url.startswith("/"):
        return Request(index, number, line.custom_id, problem=f"line {number}: url {line.url!r} is not a path")
    if not bytes(line.body).lstrip().startswith(b"{"):
        return Request(index, number, line.custom_id, problem=f"line {number}: body must be a JSON object")
    return Request(index, number, line.custom_id, line.url, bytes(line.body))


def custom_id_of(raw: bytes) -> str | None:
    """A bad line's custom_id, where it can still be read, so its error line can be matched to it."""
    try:
        value = msgspec.json.decode(raw)
    except msgspec.DecodeError:
        return None
    custom_id = value.get("custom_id") if isinstance(value, dict) else None
    return custom_id if isinstance(custom_id, str) else None


def read_jsonl_texts(path: Path, text_column: str, id_column: str | None) -> Iterator[Text]:
    """Each line a JSON string, or an object with the text (and id) in the named fields."""
    for index, (number, raw) in enumerate(nonblank_lines(path)):
        try:
            value = msgspec.json.decode(raw)
        except msgspec.DecodeError as exc:
            yield Text(index, number, None, problem=f"line {number}: {exc}")
            continue
        if isinstance(value, str):
            yield Text(index, number, None, value)
        elif isinstance(value, dict):
            yield text_of(index, number, value, text_column, id_column)
        else:
            problem = f"line {number}: expected a JSON string or an object with {text_column!r}"
            yield Text(index, number, None, problem=problem)


def text_of(index: int, number: int, row: dict[str, Any], text_column: str, id_column: str | None) -> Text:
    key = row.get(id_column) if id_column else None
    text = row.get(text_column)
    if not isinstance(text, str):
        kind = "missing" if text is None else f"of type {type(text).__name__}, not a string"
        return Text(index, number, key, problem=f"line {number}: {text_column!r} is {kind}")
    return Text(index, number, key, text)


def read_csv_texts(path: Path, text_column: str, id_column: str | None) -> Iterator[Text]:
    with path.open(newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f)
        check_columns(reader.fieldnames or [], text_column, id_column, path)
        for index, row in enumerate(reader):
            yield text_of(index, reader.line_num, row, text_column, id_column)


def parquet_file(path: Path) -> Any:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise InputError("reading Parquet needs pyarrow (pip install pyarrow)") from None
    return pq.ParquetFile(path)


def read_parquet_texts(path: Path, text_column: str, id_column: str | None) -> Iterator[Text]:
    """Rows numbered from 1 as `line`, read a record batch at a time."""
    source = parquet_file(path)
    check_columns(source.schema_arrow.names, text_column, id_column, path)
    columns = [text_column] if not id_column else [text_column, id_column]
    counter = itertools.count()
    for batch in source.iter_batches(batch_size=4096, columns=columns):
        for row in batch.to_pylist():
            index = next(counter)
            yield text_of(index, index + 1, row, text_column, id_column)


def check_columns(names: Sequence[str], text_column: str, id_column: str | None, path: Path) -> None:
    for column, flag in ((text_column, "--text-column"), (id_column, "--id-column")):
        if column and column not in names:
            raise InputError(f"{path} has no column {column!r} ({flag}); its columns: {', '.join(names)}")
