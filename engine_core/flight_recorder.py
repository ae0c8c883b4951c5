"""Which requests were in the forward pass when the engine died, kept in a file the next engine reads.

Before each forward pass the engine writes the (API server, request id) pairs of the batch; after
it, an empty record. The page cache keeps the last write when the process dies however it dies,
so a restarted engine knows which requests were running (suspects) and which were only queued, and
so do the API servers, which read it the moment they lose the engine (the file's format:
poolserve/flight_record.py).
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterable

import msgspec

from poolserve.flight_record import LENGTH_BYTES, encode_record, read_record

RESERVED_BYTES = 64 * 1024

logger = logging.getLogger("poolserve.engine")


class FlightRecorder:
    def __init__(self, path: str):
        self.path = path
        self._encoder = msgspec.msgpack.Encoder()
        self._fd = -1
        self._has_failed = False

    def read_suspects(self) -> dict[bytes, list[int]]:
        """What the previous engine left: request ids by API-server identity; empty on a first start."""
        return read_record(self.path) or {}

    def open(self) -> None:
        self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        # Blocks for every record of up to a few thousand requests, taken now: on a full disk a record
        # would fail to write, and the engine with it.
        with contextlib.suppress(OSError):
            os.posix_fallocate(self._fd, 0, RESERVED_BYTES)
        self.clear()

    def record(self, running: Iterable[tuple[bytes, int]]) -> None:
        self._write(encode_record(list(running), self._encoder))

    def clear(self) -> None:
        self._write(bytes(LENGTH_BYTES))

    def _write(self, data: bytes) -> None:
        """A record that cannot be written (a full disk) is lost, never the engine: the cleared record it
        leaves, like a torn one, reads as no suspects."""
        try:
            os.pwrite(self._fd, data, 0)
        except OSError as exc:
            if not self._has_failed:
                self._has_failed = True
                logger.warning("flight recorder: cannot write %s (%s); a crash now blames no request", self.path, exc)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
