from __future__ import annotations

import msgspec
import numpy as np
import numpy.typing as npt
import pytest

from engine_core.request_state import InvalidRequest, PendingRequest, check_request
from poolserve.model_card import ModelCard
from poolserve.protocol import EngineRequest
from tests.cards import CARD, CLIP_CARD
from tests.engine_core.pending import pool_request


def admit(request: EngineRequest, card: ModelCard = CARD) -> PendingRequest:
    return check_request(b"api-0", request, card)


def images(count: int, height: int, width: int) -> list[npt.NDArray[np.uint8]]:
    return [np.zeros((height, width, 3), dtype=np.uint8)] * count


def test_a_valid_request_is_admitted() -> None:
    request = admit(pool_request([[101, 7], [102]], request_id=1, dimensions=8))
    assert request.input_ids(0).tolist() == [101, 7]
    assert request.input_ids(1).tolist() == [102]
    assert (request.id, request.params.dimensions) == (1, 8)


@pytest.mark.parametrize(("sent", "normalize"), [(None, True), (False, False), (True, True)])
def test_normalize_none_is_the_models_own_choice(sent: bool | None, normalize: bool) -> None:
    assert admit(pool_request([[101]], normalize=sent)).params.normalize is normalize


@pytest.mark.parametrize(
    ("message", "reason"),
    [
        (pool_request([[1] * 300]), "lengths"),
        (pool_request([[1, 30522]]), "token ids"),
        (pool_request([[1, -5]]), "token ids"),
        # past the length where ids are checked on a list rather than by numpy (request_state.SHORT_ARRAY)
        (pool_request([[1] * 199 + [30522]]), "token ids"),
        (pool_request([[-5] + [1] * 199]), "token ids"),
        (pool_request([[1]], dimensions=385), "dimensions"),
        (pool_request([[1]], dimensions=-3), "dimensions"),
        (pool_request([[1]], [[0]]), "no token types"),
        (pool_request([], images=images(1, 4, 3)), "no images"),
    ],
)
def test_values_a_model_cannot_take_are_refused_not_run(message: EngineRequest, reason: str) -> None:
    with pytest.raises(InvalidRequest, match=reason):
        admit(message)


PAIR_CARD = msgspec.structs.replace(CARD, uses_token_types=True, type_vocab_size=2)


@pytest.mark.parametrize(
    ("message", "reason"),
    [
        (pool_request([[101, 102]], [[0, 2]]), "token type ids"),
        (pool_request([[101, 102]], [[-1, 0]]), "token type ids"),
    ],
)
def test_token_types_past_the_models_type_embeddings_are_refused_before_they_reach_a_batch(
    message: EngineRequest, reason: str
) -> None:
    with pytest.raises(InvalidRequest, match=reason):
        admit(message, PAIR_CARD)


def test_token_types_within_the_models_range_are_admitted() -> None:
    request = admit(pool_request([[101, 7, 102]], [[0, 1, 1]]), PAIR_CARD)
    assert request.input_token_types(0).tolist() == [0, 1, 1]


def test_images_of_another_size_than_the_models_are_refused() -> None:
    with pytest.raises(InvalidRequest, match="4x3"):
        admit(pool_request([], images=images(1, 3, 4)), CLIP_CARD)
    request = admit(pool_request([], images=images(2, 4, 3)), CLIP_CARD)
    assert (request.count, request.total_cost) == (2, 100)
