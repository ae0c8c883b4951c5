"""The engine's exact-match cache of raw pooled rows, shared by every API server, bounded in bytes.

What is cached is one input's row as the model's pooling gives it, before the request's own
finishing (normalize, `dimensions`, activation: engine_core/postprocess.py), so requests that
differ only in those share an entry and each still gets its own finishing. The key is a hash of
what determines that row in this engine: the token ids and token type ids of a text, or an image's
pixels after the API server's resize and crop, tagged by what was asked of it (a text's pooled row, or
its per-token states: a length x hidden array, cached as one entry; or its sparse row's entries) (the model, its
pooling and its dtype are fixed for the engine's life; a restarted engine starts empty). Least recently used entries
go first.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict

import numpy as np
import numpy.typing as npt

from engine_core.metrics import CACHE_BYTES, CACHE_EVICTIONS, CACHE_HITS, CACHE_MISSES, engine_labels
from engine_core.runner import SparseRow

F32 = npt.NDArray[np.float32]
Row = F32 | SparseRow
# What an entry costs besides its row: the key, the OrderedDict's node, the array header.
ENTRY_OVERHEAD_BYTES = 200


def input_key(kind: bytes, *arrays: npt.NDArray[np.generic] | None) -> bytes:
    """A 16-byte digest of an input's arrays (None for an absent one), tagged by kind (text, image)."""
    digest = hashlib.blake2b(kind, digest_size=16)
    for array in arrays:
        if array is None:
            digest.update(b"\x00")
        else:
            digest.update(b"\x01%d:" % array.nbytes)
            digest.update(np.ascontiguousarray(array).data)
    return digest.digest()


class EmbeddingCache:
    """Rows by key, least recently used first; `max_bytes` 0 keeps nothing."""

    def __init__(self, max_bytes: int):
        self.max_bytes = max_bytes
        self.bytes = 0
        self._rows: OrderedDict[bytes, Row] = OrderedDict()

    def __len__(self) -> int:
        return len(self._rows)

    def get(self, key: bytes) -> Row | None:
        row = self._rows.get(key)
        if row is None:
            CACHE_MISSES.labels(*engine_labels()).inc()
            return None
        self._rows.move_to_end(key)
        CACHE_HITS.labels(*engine_labels()).inc()
        return row

    def put(self, key: bytes, row: Row) -> None:
        cost = row.nbytes + ENTRY_OVERHEAD_BYTES
        if cost > self.max_bytes or key in self._rows:
            return
        # A copy: the row given is a view of a batch's output, which would otherwise stay alive whole.
        if isinstance(row, SparseRow):
            self._rows[key] = SparseRow(row.indices.copy(), row.values.copy())
        else:
            self._rows[key] = np.array(row, dtype=np.float32)
        self.bytes += cost
        while self.bytes > self.max_bytes:
            _, evicted = self._rows.popitem(last=False)
            self.bytes -= evicted.nbytes + ENTRY_OVERHEAD_BYTES
            CACHE_EVICTIONS.labels(*engine_labels()).inc()
        CACHE_BYTES.labels(*engine_labels()).set(self.bytes)
