"""The job's output file: lines appended in input order, and what an earlier, interrupted run left in it.

Lines are appended with O_APPEND, a run of whole lines per write(2), and bytes land in order, so every
newline in the file ends a complete line: a run killed mid-write leaves at most one unterminated line
at the end. Reopening cuts that tail off and reports how many complete lines there are and the last of
them, which the job checks against the input item at that position before it skips that many items.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

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


class OrderedOutput:
    """Takes each unit of work's lines as it finishes, in any order, and appends them in input order."""

    def __init__(self, path: Path, first: int) -> None:
        self.fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self.next = first  # the sequence number of the next unit to write
        self.waiting: dict[int, list[bytes]] = {}

    def put(self, seq: int, lines: list[bytes]) -> int:
        """Files `lines` (each ending in a newline) for unit `seq`; returns how many lines were written now."""
        self.waiting[seq] = lines
        ready: list[bytes] = []
        while self.next in self.waiting:
            ready.extend(self.waiting.pop(self.next))
            self.next += 1
        if ready:
            write_all(self.fd, b"".join(ready))
        return len(ready)

    def close(self) -> None:
        os.fsync(self.fd)
        os.close(self.fd)


def write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]
