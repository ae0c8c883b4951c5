"""The job's output file: lines appended in input order, and what an earlier, interrupted run left in it.

Lines are appended with O_APPEND, a run of whole lines per write(2), and bytes land in order, so every
newline in the file ends a complete line: a run killed mid-write leaves at most one unterminated line
at the end. Reopening cuts that tail off and reports how many complete lines there are and the last of
them, which the job checks against the input item at that position before it skips that many items.

The errors file lists the bad items alone (their input line numbers and errors, one JSON line each), so that a
job over millions of lines shows its few failures without a scan of OUTPUT.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import msgspec

CHUNK = 1 << 20


@dataclass(slots=True)
class Existing:
    """What a previous run left: `lines` complete lines (`last` the final one, no newline); `cut` bytes
    of an unfinished line were removed."""

    lines: int
    last: bytes
    cut: int


def recover(path: Path) -> Existing:
    """Counts the file's complete lines and truncates anything after the last newline."""
    if not path.exists():
        return Existing(0, b"", 0)
    lines, last_end, previous_end, offset = 0, 0, 0, 0
    with path.open("rb") as f:
        while chunk := f.read(CHUNK):
            count = chunk.count(b"\n")
            if count:
                lines += count
                end = chunk.rfind(b"\n")
                # The line before the last: in this chunk, or the previous chunk's last.
                previous_end = offset + chunk.rfind(b"\n", 0, end) + 1 if count > 1 else last_end
                last_end = offset + end + 1
            offset += len(chunk)
        f.seek(previous_end)
        last = f.read(last_end - previous_end).rstrip(b"\n")
    if offset > last_end:
        os.truncate(path, last_end)
    return Existing(lines, last, offset - last_end)


def default_errors_path(output: Path) -> Path:
    """Where a job lists its bad lines unless --errors says: beside OUTPUT (answers.jsonl: answers.errors.jsonl)."""
    return output.with_name(f"{output.stem}.errors.jsonl")


def recover_errors(path: Path, answered: int) -> None:
    """The errors file kept to the items OUTPUT answers: an item's error is written before its output line, so a
    run killed between the two leaves an error of an item the next run answers again; it is dropped here (a new
    job, `answered` 0, starts an empty file)."""
    if not path.exists():
        return
    kept = [line for line in path.read_bytes().splitlines(keepends=True) if error_index(line) < answered]
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_bytes(b"".join(line if line.endswith(b"\n") else line + b"\n" for line in kept))
    os.replace(temporary, path)


def error_index(line: bytes) -> int:
    """The item an errors-file line is about; an unreadable line (a write cut short) counts as past the end."""
    try:
        index = msgspec.json.decode(line).get("index")
    except (msgspec.DecodeError, AttributeError):
        return 1 << 62
    return index if isinstance(index, int) else 1 << 62


class OrderedOutput:
    """Takes each unit of work's lines as it finishes, in any order, and appends them in input order; the errors
    among them go to the errors file too, each before its output line."""

    def __init__(self, path: Path, first: int, errors: Path | None = None) -> None:
        self.fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self.errors_fd = None if errors is None else os.open(errors, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self.next = first  # the sequence number of the next unit to write
        self.waiting: dict[int, tuple[list[bytes], list[bytes]]] = {}

    def put(self, seq: int, lines: list[bytes], errors: Sequence[bytes] = ()) -> int:
        """Files `lines` (each ending in a newline) and the error lines among them for unit `seq`; returns how
        many lines were written now."""
        self.waiting[seq] = (lines, list(errors))
        ready: list[bytes] = []
        failed: list[bytes] = []
        while self.next in self.waiting:
            unit_lines, unit_errors = self.waiting.pop(self.next)
            ready.extend(unit_lines)
            failed.extend(unit_errors)
            self.next += 1
        if failed and self.errors_fd is not None:
            write_all(self.errors_fd, b"".join(failed))
        if ready:
            write_all(self.fd, b"".join(ready))
        return len(ready)

    def close(self) -> None:
        for fd in (self.errors_fd, self.fd):
            if fd is not None:
                os.fsync(fd)
                os.close(fd)


def write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]
