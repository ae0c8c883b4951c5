"""A response's head and first body part leave in one send; everything else is written as the cycle wrote it."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from apiserver.connection.response_writes import ResponseWrites


@dataclass
class Cycle:
    response_started: bool = False


@dataclass
class RecordingTransport(asyncio.Transport):
    """Each call the view makes, as ("write", data), ("writelines", [parts]) or ("close",)."""

    calls: list[tuple[Any, ...]] = field(default_factory=list)

    def write(self, data: Any) -> None:
        self.calls.append(("write", bytes(data)))

    def writelines(self, list_of_data: Any) -> None:
        self.calls.append(("writelines", [bytes(part) for part in list_of_data]))

    def close(self) -> None:
        self.calls.append(("close",))


def test_the_head_goes_out_with_the_first_body_part_in_one_call() -> None:
    transport, cycle = RecordingTransport(), Cycle()
    writes = ResponseWrites(transport, cycle)
    writes.write(b"HTTP/1.1 100 Continue\r\n\r\n")  # before the answer starts: straight through
    cycle.response_started = True
    writes.write(b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\n")
    assert transport.calls == [("write", b"HTTP/1.1 100 Continue\r\n\r\n")]
    writes.write(b"hello")
    writes.write(b"more")  # a later part of a streamed body: straight through
    assert transport.calls[1:] == [
        ("writelines", [b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\n", b"hello"]),
        ("write", b"more"),
    ]


def test_a_held_head_is_written_before_the_connection_closes() -> None:
    transport, cycle = RecordingTransport(), Cycle(response_started=True)
    writes = ResponseWrites(transport, cycle)
    writes.write(b"HTTP/1.1 200 OK\r\n\r\n")  # the app fails before its body: uvicorn closes the connection
    writes.close()
    assert transport.calls == [("write", b"HTTP/1.1 200 OK\r\n\r\n"), ("close",)]
