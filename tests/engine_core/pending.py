"""Engine requests for the engine's tests: a scheduler's pending request made from input lengths alone (its token
ids a ramp), and an EngineRequest made from token rows as the API server makes one, read back through the wire."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from engine_core.request_state import PendingRequest
from poolserve.protocol import U8, ClientWire, EngineRequest, EngineWire, PoolingParams


def make_request(
    request_id: int, lengths: list[int], identity: bytes = b"api-0", *, priority: int = 0
) -> PendingRequest:
    tokens = np.arange(sum(lengths), dtype=np.int32)
    return PendingRequest(identity=identity, id=request_id, lengths=lengths, tokens=tokens, priority=priority)


def pool_request(
    rows: Sequence[Sequence[int]],
    type_rows: Sequence[Sequence[int]] | None = None,
    images: Sequence[U8] = (),
    *,
    request_id: int = 0,
    priority: int = 0,
    traced: bool = False,
    **params: Any,
) -> EngineRequest:
    """The request an API server sends for these rows and images, with these PoolingParams, as the engine reads it."""
    request = EngineRequest.from_rows(
        rows, type_rows, images, params=PoolingParams(**params), priority=priority, traced=traced
    )
    request.id = request_id
    decoded = EngineWire().decode(ClientWire().encode(request))
    assert isinstance(decoded, EngineRequest)
    return decoded
