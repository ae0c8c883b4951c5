from __future__ import annotations

import msgspec
import numpy as np
import pytest

from engine_core.io_thread import InvalidRequest, check_request
from poolserve.protocol import PoolRequest
from tests.poolserve.test_protocol import CARD


def tokens(*ids: int) -> bytes:
    return np.asarray(ids, dtype="<i4").tobytes()


def test_a_valid_request_is_admitted() -> None:
    request = check_request(b"api-0", PoolRequest(1, [2, 1], 8), [tokens(101, 7, 102)], CARD)
    assert request.input_ids(0).tolist() == [101, 7]
    assert request.input_ids(1).tolist() == [102]
    assert request.dimensions == 8


@pytest.mark.parametrize(
    ("message", "frames", "reason"),
    [
        (PoolRequest(1, []), [b""], "no inputs"),
        (PoolRequest(1, [0]), [b""], "lengths"),
        (PoolRequest(1, [300]), [tokens(*[1] * 300)], "lengths"),
        (PoolRequest(1, [3]), [tokens(1, 2)], "frame size"),
        (PoolRequest(1, [2]), [tokens(1, 30522)], "token ids"),
        (PoolRequest(1, [2]), [tokens(1, -5)], "token ids"),
        (PoolRequest(1, [1], 385), [tokens(1)], "dimensions"),
        (PoolRequest(1, [1]), [], "frame"),
    ],
)
def test_malformed_requests_are_refused_not_run(message: PoolRequest, frames: list[bytes], reason: str) -> None:
    with pytest.raises(InvalidRequest, match=reason):
        check_request(b"api-0", message, frames, CARD)


PAIR_CARD = msgspec.structs.replace(CARD, uses_token_types=True, type_vocab_size=2)


@pytest.mark.parametrize(
    ("message", "frames", "reason"),
    [
        (PoolRequest(1, [2], token_types=True), [tokens(101, 102), tokens(0, 2)], "token type ids"),
        (PoolRequest(1, [2], token_types=True), [tokens(101, 102), tokens(-1, 0)], "token type ids"),
        (PoolRequest(1, [2**64 - 1]), [tokens(1)], "lengths"),
        (PoolRequest(1, [1], images=-3), [tokens(1)], "no inputs"),
    ],
)
def test_values_a_model_cannot_take_are_refused_before_they_reach_a_batch(
    message: PoolRequest, frames: list[bytes], reason: str
) -> None:
    with pytest.raises(InvalidRequest, match=reason):
        check_request(b"api-0", message, frames, PAIR_CARD)


def test_token_types_within_the_models_range_are_admitted() -> None:
    message = PoolRequest(1, [3], token_types=True)
    request = check_request(b"api-0", message, [tokens(101, 7, 102), tokens(0, 1, 1)], PAIR_CARD)
    assert request.input_token_types(0).tolist() == [0, 1, 1]
