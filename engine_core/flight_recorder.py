"""Which requests were in the forward pass when the engine died, kept in a file the next engine reads.

Before each forward pass the engine writes the (API server, request id) pairs of the batch; after
it, an empty record. The page cache keeps the last write when the process dies however it dies,
so a restarted engine knows which requests were running (suspects) and which were only queued.
"""

from __future__ import annotations

import contextlib
import os
from collections import defaultdict
from collections.abc import Iterable

import msgspec

LENGTH_BYTES = 4


class FlightRecorder:
    def __init__(self, path: str):
        self.path = path
        self._encoder = msgspec.msgpack.Encoder()
        self._fd = -1

    def read_suspects(self) -> dict[bytes, list[int]]:
        """What the previous engine left: request ids by API-server identity; empty on a first start."""
        try:
            with open(self.path, "rb") as f:
                data = f.read()
        except FileNotFoundError:
            return {}
        size = int.from_bytes(data[:LENGTH_BYTES], "little") if len(data) >= LENGTH_BYTES else 0
        suspects: dict[bytes, list[int]] = defaultdict(list)
        if size:
            # A torn or foreign file means no suspects, never a failed start.
            with contextlib.suppress(msgspec.DecodeError, ValueError):
                payload = data[LENGTH_BYTES : LENGTH_BYTES + size]
                for identity, request_id in msgspec.msgpack.decode(payload, type=list[tuple[bytes, int]]):
                    suspects[identity].append(request_id)
        return dict(suspects)

    def open(self) -> None:
        self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        self.clear()

    def record(self, running: Iterable[tuple[bytes, int]]) -> None:
        payload = self._encoder.encode(list(running))
        os.pwrite(self._fd, len(payload).to_bytes(LENGTH_BYTES, "little") + payload, 0)

    def clear(self) -> None:
        os.pwrite(self._fd, bytes(LENGTH_BYTES), 0)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
