"""A scheduler's pending request, made from input lengths alone (its token ids a ramp)."""

from __future__ import annotations

import numpy as np

from engine_core.request_state import PendingRequest


def make_request(
    request_id: int, lengths: list[int], identity: bytes = b"api-0", *, priority: int = 0
) -> PendingRequest:
    lengths_array = np.asarray(lengths, dtype=np.int64)
    tokens = np.arange(int(lengths_array.sum()), dtype=np.int32)
    return PendingRequest(
        identity=identity, id=request_id, lengths=lengths_array, tokens=tokens, dimensions=0, priority=priority
    )
