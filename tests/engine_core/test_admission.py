from __future__ import annotations

import msgspec
import numpy as np
import pytest

from engine_core.request_state import InvalidRequest, PendingRequest, check_request
from poolserve.protocol import ModelCard, PoolJob, PoolRequest, decode_job
from tests.cards import CARD, CLIP_CARD


def tokens(*ids: int) -> bytes:
    return np.asarray(ids, dtype="<i4").tobytes()


def admit(header: PoolRequest, frames: list[bytes], card: ModelCard = CARD) -> PendingRequest:
    return check_request(b"api-0", header, decode_job(header, frames), card)


def test_a_valid_request_is_admitted() -> None:
    request = admit(PoolRequest(1, [2, 1], 8), [tokens(101, 7, 102)])
    assert request.input_ids(0).tolist() == [101, 7]
    assert request.input_ids(1).tolist() == [102]
    assert request.dimensions == 8


@pytest.mark.parametrize(("sent", "normalize"), [(None, True), (False, False), (True, True)])
def test_normalize_none_is_the_models_own_choice(sent: bool | None, normalize: bool) -> None:
    job = PoolJob.from_rows([[101]], normalize=sent)
    assert check_request(b"api-0", job.header(1), job, CARD).normalize is normalize


@pytest.mark.parametrize(
    ("message", "frames", "reason"),
    [
        (PoolRequest(1, [300]), [tokens(*[1] * 300)], "lengths"),
        (PoolRequest(1, [2]), [tokens(1, 30522)], "token ids"),
        (PoolRequest(1, [2]), [tokens(1, -5)], "token ids"),
        # past the length where ids are checked on a list rather than by numpy (request_state.SHORT_ARRAY)
        (PoolRequest(1, [200]), [tokens(*[1] * 199, 30522)], "token ids"),
        (PoolRequest(1, [200]), [tokens(-5, *[1] * 199)], "token ids"),
        (PoolRequest(1, [1], 385), [tokens(1)], "dimensions"),
        (PoolRequest(1, [1], -3), [tokens(1)], "dimensions"),
        (PoolRequest(1, [1], token_types=True), [tokens(1), tokens(0)], "no token types"),
        (PoolRequest(1, [], images=1, image_height=4, image_width=3), [b"", b"\0" * 36], "no images"),
    ],
)
def test_values_a_model_cannot_take_are_refused_not_run(message: PoolRequest, frames: list[bytes], reason: str) -> None:
    with pytest.raises(InvalidRequest, match=reason):
        admit(message, frames)


PAIR_CARD = msgspec.structs.replace(CARD, uses_token_types=True, type_vocab_size=2)


@pytest.mark.parametrize(
    ("message", "frames", "reason"),
    [
        (PoolRequest(1, [2], token_types=True), [tokens(101, 102), tokens(0, 2)], "token type ids"),
        (PoolRequest(1, [2], token_types=True), [tokens(101, 102), tokens(-1, 0)], "token type ids"),
    ],
)
def test_token_types_past_the_models_type_embeddings_are_refused_before_they_reach_a_batch(
    message: PoolRequest, frames: list[bytes], reason: str
) -> None:
    with pytest.raises(InvalidRequest, match=reason):
        admit(message, frames, PAIR_CARD)


def test_token_types_within_the_models_range_are_admitted() -> None:
    message = PoolRequest(1, [3], token_types=True)
    request = admit(message, [tokens(101, 7, 102), tokens(0, 1, 1)], PAIR_CARD)
    assert request.input_token_types(0).tolist() == [0, 1, 1]


def test_images_of_another_size_than_the_models_are_refused() -> None:
    message = PoolRequest(1, [], images=1, image_height=3, image_width=4)
    with pytest.raises(InvalidRequest, match="4x3"):
        admit(message, [b"", b"\0" * 36], CLIP_CARD)
    fitting = PoolRequest(1, [], images=2, image_height=4, image_width=3)
    request = admit(fitting, [b"", b"\0" * 72], CLIP_CARD)
    assert (request.count, request.total_cost) == (2, 100)
