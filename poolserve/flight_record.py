"""The flight record's file: which requests an engine's forward pass held, as the engine wrote it last.

The engine writes it (engine_core/flight_recorder.py) before and after each forward pass; two readers
read it after the engine died: the engine that replaces it (to name its suspects in the handshake) and
each API server at the moment it loses the engine (to know at once which of its requests to blame,
before any other engine sees them). A length, then msgpack's list of (API-server identity, request id).
"""

from __future__ import annotations

import contextlib
import os
from collections import defaultdict

import msgspec

LENGTH_BYTES = 4


def flight_record_path(runtime_dir: str, engine_name: str) -> str:
    """One file per engine (`engine-flight`, `engine-1-flight`): a restart names what it ran, not a sibling."""
    return os.path.join(runtime_dir, f"{engine_name}-flight")


def encode_record(running: list[tuple[bytes, int]], encoder: msgspec.msgpack.Encoder) -> bytes:
    payload = encoder.encode(running)
    return len(payload).to_bytes(LENGTH_BYTES, "little") + payload


def read_record(path: str) -> dict[bytes, list[int]] | None:
    """Request ids by API-server identity; empty for a cleared record or a torn or foreign file (never an
    error); None when there is no file to read."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return None
    size = int.from_bytes(data[:LENGTH_BYTES], "little") if len(data) >= LENGTH_BYTES else 0
    running: dict[bytes, list[int]] = defaultdict(list)
    if size:
        with contextlib.suppress(msgspec.DecodeError, ValueError):
            payload = data[LENGTH_BYTES : LENGTH_BYTES + size]
            for identity, request_id in msgspec.msgpack.decode(payload, type=list[tuple[bytes, int]]):
                running[identity].append(request_id)
    return dict(running)
