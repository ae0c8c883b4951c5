from __future__ import annotations

import msgspec
import pytest

from poolserve.protocol import (
    Abort,
    Hello,
    ModelCard,
    Outputs,
    Ping,
    Pong,
    PooledOutput,
    PoolRequest,
    Ready,
    make_client_decoder,
    make_encoder,
    make_engine_decoder,
)

CARD = ModelCard(
    path="/models/m",
    architecture="BertModel",
    kind="embedding",
    tasks=["embed", "score", "pool", "tokenize"],
    max_model_len=256,
    output_size=384,
    vocab_size=30522,
    pooling="mean",
    normalize=True,
    pad_token_id=0,
    tokenizer_json="{}",
    device="cpu",
    dtype="float32",
)


@pytest.mark.parametrize(
    "message",
    [
        Hello(1, 1234),
        PoolRequest(7, [3, 4, 1], 64),
        PoolRequest(8, [2]),
        PoolRequest(9, [], normalize=0, activation=False, images=3),
        PoolRequest(10, [4], token_types=True),
        Abort([1, 2]),
        Ping(5),
    ],
)
def test_messages_to_the_engine_round_trip(message: object) -> None:
    assert make_engine_decoder().decode(make_encoder().encode(message)) == message


@pytest.mark.parametrize(
    "message",
    [Ready(CARD), Outputs([PooledOutput(1, 2, 384), PooledOutput(2, 0, 0, "boom")]), Pong(9)],
)
def test_messages_from_the_engine_round_trip(message: object) -> None:
    assert make_client_decoder().decode(make_encoder().encode(message)) == message


def test_a_new_trailing_field_keeps_old_peers_compatible() -> None:
    # An older sender without `dimensions` still decodes: new fields get defaults and go last.
    old = msgspec.msgpack.encode(["pool", 3, [5]])
    assert make_engine_decoder().decode(old) == PoolRequest(3, [5], 0, normalize=-1, activation=True)


@pytest.mark.parametrize(
    "garbage", [b"", b"\xc1", msgspec.msgpack.encode(["nope", 1]), msgspec.msgpack.encode({"a": 1})]
)
def test_garbage_is_a_decode_error_not_a_crash(garbage: bytes) -> None:
    with pytest.raises(msgspec.DecodeError):
        make_engine_decoder().decode(garbage)


def test_engine_messages_are_not_accepted_as_client_messages() -> None:
    with pytest.raises(msgspec.ValidationError):
        make_client_decoder().decode(make_encoder().encode(Hello(0, 1)))
