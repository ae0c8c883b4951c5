from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypeVar

import msgspec
import numpy as np
import numpy.typing as npt
import pytest
from typing_extensions import TypeAliasType

from poolserve.model_card import LateInteraction
from poolserve.protocol import (
    Abort,
    Buffer,
    ClientWire,
    EngineRequest,
    EngineWire,
    Frame,
    Hello,
    OutputRows,
    Outputs,
    Ping,
    Pong,
    PooledOutput,
    PoolingParams,
    ProtocolError,
    Ready,
    RequestFailed,
    SparseRows,
    array_dtype,
    decode_rows,
)
from tests.cards import CARD, CLIP_CARD


def received(frames: Sequence[Frame]) -> list[bytes]:
    """What the other end's recv_multipart gives: every frame as bytes."""
    return [bytes(frame) for frame in frames]


def image(seed: int) -> npt.NDArray[np.uint8]:
    return np.random.default_rng(seed).integers(0, 256, (4, 3, 3), dtype=np.uint8)


def assert_same_request(decoded: EngineRequest, sent: EngineRequest) -> None:
    assert decoded.lengths == sent.lengths
    np.testing.assert_array_equal(decoded.tokens, sent.tokens)
    for got, want in ((decoded.token_types, sent.token_types), (decoded.pixels, sent.pixels)):
        assert (got is None) == (want is None)
        if got is not None:
            np.testing.assert_array_equal(got, want)
    assert decoded.params == sent.params
    assert (decoded.id, decoded.priority, decoded.traced, decoded.attempt, decoded.is_suspect) == (
        sent.id,
        sent.priority,
        sent.traced,
        sent.attempt,
        sent.is_suspect,
    )


def request(
    rows: list[list[int]],
    type_rows: list[list[int]] | None = None,
    images: Sequence[npt.NDArray[np.uint8]] = (),
    priority: int = 0,
    **params: Any,
) -> EngineRequest:
    return EngineRequest.from_rows(rows, type_rows, images, params=PoolingParams(**params), priority=priority)


def sent_frames(message: EngineRequest) -> list[bytes]:
    return received(ClientWire().encode(message))


REQUESTS = {
    "texts": request([[101, 7, 102], [101, 102]], dimensions=64, priority=-3),
    "pairs": request([[101, 7, 102, 8, 102]], [[0, 0, 0, 1, 1]], normalize=False, activation=False),
    "images only": request([], images=[image(1), image(2)], normalize=True),
    "texts and images": request([[5]], images=[image(3)]),
    "late-interaction queries and documents": request([[101, 7, 102], [101, 102]], per_token=True, queries=1),
    "bge-m3's lexical weights": request([[0, 7, 2]], sparse=True),
    "texts pooled after their prompt": request([[101, 7, 8, 102], [101, 9, 102]], pool_from=[2, 0]),
}


@pytest.mark.parametrize("sent", REQUESTS.values(), ids=REQUESTS.keys())
def test_a_pool_request_round_trips_with_its_frames(sent: EngineRequest) -> None:
    sent = msgspec.structs.replace(sent, id=7, attempt=2, is_suspect=True)
    decoded = EngineWire().decode(sent_frames(sent))
    assert isinstance(decoded, EngineRequest)
    assert_same_request(decoded, sent)


def test_a_request_header_names_each_array_by_its_frame_and_shape() -> None:
    frames = sent_frames(REQUESTS["texts and images"])
    header = msgspec.msgpack.decode(frames[0])
    assert header[:6] == ["pool", 0, [1], [1, 1], None, [2, 1, 4, 3, 3]]
    assert header[6][1] is None  # normalize: the model's own choice, sent as nil
    assert len(frames) == 3


def test_decoded_arrays_are_views_of_the_received_frames_not_copies() -> None:
    frames = sent_frames(REQUESTS["pairs"])
    decoded = EngineWire().decode(frames)
    assert isinstance(decoded, EngineRequest) and decoded.token_types is not None
    for array, frame in ((decoded.tokens, frames[1]), (decoded.token_types, frames[2])):
        assert np.shares_memory(array, np.frombuffer(frame, dtype=np.uint8))
        assert not array.flags.writeable


def test_sent_frames_are_views_of_the_requests_arrays_not_copies() -> None:
    sent = REQUESTS["images only"]
    _, tokens, pixels = ClientWire().encode(sent)
    assert isinstance(pixels, memoryview) and pixels.nbytes == 2 * 4 * 3 * 3
    assert sent.pixels is not None and np.shares_memory(np.frombuffer(pixels, dtype=np.uint8), sent.pixels)
    assert isinstance(tokens, memoryview) and tokens.nbytes == 0


@pytest.mark.parametrize("message", [Hello(1, 1234), Abort([1, 2]), Ping(5)])
def test_header_only_messages_to_the_engine_round_trip(message: Hello | Abort | Ping) -> None:
    assert EngineWire().decode(received(ClientWire().encode(message))) == message


@pytest.mark.parametrize(
    "message",
    [
        Ready(CARD),
        Ready(CLIP_CARD, suspects=[3, 4]),
        Pong(9),
        Pong(1, stalled_for=2.5, queued_inputs=3, queued_tokens=40),
    ],
)
def test_header_only_messages_from_the_engine_round_trip(message: Ready | Pong) -> None:
    assert ClientWire().decode(received(EngineWire().encode(message))) == message


def test_outputs_round_trip_with_one_float32_frame_for_every_finished_request() -> None:
    first = np.arange(6, dtype=np.float32).reshape(2, 3)
    second = np.ones((1, 384), dtype=np.float32)
    third = np.full((1, 3), 7, dtype=np.float32)
    outputs = [
        (PooledOutput(1, 2, 3, queue_time=0.5), first),
        (PooledOutput(2, 1, 384, inference_time=0.1), second),
        (PooledOutput(5, 1, 3), third),
    ]
    failures = [RequestFailed(3, "model_error", "boom"), RequestFailed(4, "overloaded", "full")]
    frames = received(EngineWire().encode_outputs(outputs, failures))
    assert len(frames) == 2  # one frame of rows; failures take none
    assert len(frames[1]) == (6 + 384 + 3) * 4
    msg = ClientWire().decode(frames)
    assert msg == Outputs([out for out, _ in outputs], failures)
    assert isinstance(msg, Outputs)
    rows = decode_rows(msg, frames[1:])
    for got, want in zip(rows, (first, second, third), strict=True):
        np.testing.assert_array_equal(got, want)
        assert got.dtype == np.float32 and np.shares_memory(got, np.frombuffer(frames[1], dtype=np.uint8))


def test_rows_of_another_dtype_or_layout_are_sent_as_contiguous_float32() -> None:
    rows = np.arange(12, dtype=np.float64).reshape(3, 4)[:, ::2]
    frames = received(EngineWire().encode_outputs([(PooledOutput(1, 3, 2), rows)]))
    msg = ClientWire().decode(frames)
    assert isinstance(msg, Outputs)
    np.testing.assert_array_equal(decode_rows(msg, frames[1:])[0], rows.astype(np.float32))


def test_rows_that_do_not_match_their_output_are_a_bug_caught_before_sending() -> None:
    with pytest.raises(ValueError, match="shape"):
        EngineWire().encode_outputs([(PooledOutput(1, 2, 3), np.zeros((3, 2), dtype=np.float32))])


@pytest.mark.parametrize(
    ("field", "value"), [("kind", "transformer"), ("tasks", ["embed", "dance"]), ("activation", "relu")]
)
def test_a_card_outside_the_closed_vocabularies_is_refused_on_decode(field: str, value: object) -> None:
    card = msgspec.to_builtins(CARD)
    card[field] = value
    with pytest.raises(ProtocolError, match=f"\\$.*{field}"):
        ClientWire().decode([msgspec.msgpack.encode(["ready", card])])


def test_an_unknown_error_code_is_refused_on_decode() -> None:
    with pytest.raises(ProtocolError, match="Invalid enum value 'teapot'"):
        ClientWire().decode([msgspec.msgpack.encode(["outputs", [], [[1, "teapot", "no"]]])])


GARBAGE: list[list[Buffer]] = [
    [],
    [b""],
    [b"\xc1"],
    [msgspec.msgpack.encode(["nope", 1])],
    [msgspec.msgpack.encode({"a": 1})],
    [msgspec.msgpack.encode(["pool", "x"])],
    [msgspec.msgpack.encode(["pool", 1, ["not", "ints"]])],
    [msgspec.msgpack.encode(["pool", 1, [2], 0, 3])],  # normalize is a bool or nil, not -1 .. 1
    [msgspec.msgpack.encode(12345)],
]


@pytest.mark.parametrize("frames", GARBAGE)
def test_garbage_to_the_engine_is_a_protocol_error_not_a_crash(frames: list[Buffer]) -> None:
    with pytest.raises(ProtocolError):
        EngineWire().decode(frames)


@pytest.mark.parametrize(
    ("frames", "request_id"),
    [
        ([msgspec.msgpack.encode(["pool", 7, [2], 0, 3])], 7),  # answerable: its sender gets a failure
        ([msgspec.msgpack.encode(["pool", 7, ["not", "ints"]])], 7),
        ([msgspec.msgpack.encode(["pool", "x"])], None),
        ([msgspec.msgpack.encode(["pool", True])], None),
        ([msgspec.msgpack.encode(["ping", 7])], None),
        ([b"\xc1"], None),
        ([], None),
    ],
)
def test_a_pool_request_that_does_not_decode_still_names_its_id(frames: list[Buffer], request_id: int | None) -> None:
    assert EngineWire().request_id_of(frames) == request_id


def test_each_end_refuses_the_other_directions_messages() -> None:
    with pytest.raises(ProtocolError):
        ClientWire().decode(ClientWire().encode(Hello(0, 1)))
    with pytest.raises(ProtocolError):
        EngineWire().decode(EngineWire().encode(Pong(1)))


def tokens(*ids: int) -> bytes:
    return np.asarray(ids, dtype="<i4").tobytes()


def header_of(message: EngineRequest) -> bytes:
    return sent_frames(message)[0]


def one_text(*ids: int, **params: Any) -> EngineRequest:
    return request([list(ids)], **params)


MISMATCHED_TYPES = EngineRequest(lengths=[2], tokens=np.ones(2, np.int32), token_types=np.ones(1, np.int32))


@pytest.mark.parametrize(
    ("message", "reason"),
    [
        ([header_of(request([])), b""], "no inputs"),
        ([header_of(one_text(1))], "not the next data frame"),
        ([header_of(one_text(1)), tokens(1), tokens(2)], "expected 1 data frame"),
        ([header_of(request([[1]], [[0]])), tokens(1)], "not the next data frame"),
        ([header_of(EngineRequest(lengths=[0])), b""], "lengths"),
        ([header_of(EngineRequest(lengths=[2**64 - 1], tokens=np.ones(1, np.int32))), tokens(1)], "lengths"),
        ([header_of(EngineRequest(lengths=[2**62] * 4, tokens=np.ones(1, np.int32))), tokens(1)], "token frame size"),
        ([header_of(EngineRequest(lengths=[3], tokens=np.ones(2, np.int32))), tokens(1, 2)], "token frame size"),
        ([header_of(one_text(1)), b"\x01\x00\x00"], "does not hold 1 <i4 values"),
        ([header_of(one_text(1, 2)), tokens(1, 2, 3)], "does not hold 2 <i4 values"),
        ([header_of(MISMATCHED_TYPES), tokens(1, 2), tokens(0)], "token type frame"),
        ([header_of(request([], images=[image(1)])), b"", b"\0" * 35], "does not hold 1x4x3x3"),
        ([header_of(request([], images=[np.zeros((0, 0, 3), np.uint8)])), b"", b""], "height x width x 3"),
        ([header_of(one_text(1, queries=2)), tokens(1)], "queries must be within"),
        ([header_of(request([[1, 2], [3]], pool_from=[1])), tokens(1, 2, 3)], "one start per text input"),
        ([header_of(one_text(1, 2, pool_from=[2])), tokens(1, 2)], "each before the input's last token"),
    ],
)
def test_frames_that_do_not_match_their_header_are_a_clear_protocol_error(message: list[bytes], reason: str) -> None:
    wire = EngineWire()
    with pytest.raises(ProtocolError, match=reason):
        wire.decode(message)
    assert wire.request_id_of(message) == 0  # its sender is told, rather than left to wait


@pytest.mark.parametrize(
    ("outputs", "frames", "reason"),
    [
        ([PooledOutput(1, 1, 2)], [], "1 output"),
        ([PooledOutput(1, 1, 2)], [b"\0" * 4], "1x2 float32"),
        ([PooledOutput(1, -1, -2)], [b"\0" * 8], "float32"),
        ([PooledOutput(1, 1, 1)], [b"\0" * 8], "more than the outputs"),
        ([PooledOutput(1, 1, 1)], [b"\0" * 3], "whole 4-byte values"),
        ([PooledOutput(1, 1, 2), PooledOutput(2, 1, 2)], [b"\0" * 12], "output 2's rows of 1x2"),
    ],
)
def test_reply_frames_that_do_not_match_their_outputs_are_a_clear_protocol_error(
    outputs: list[PooledOutput], frames: list[bytes], reason: str
) -> None:
    with pytest.raises(ProtocolError, match=reason):
        decode_rows(Outputs(outputs), frames)


def test_a_priority_past_32_bits_is_a_protocol_error() -> None:
    with pytest.raises(ProtocolError, match="priority must be within"):
        EngineWire().decode(sent_frames(request([[5]], priority=2**40)))


def sparse(rows: list[list[float]]) -> SparseRows:
    return SparseRows.from_dense(np.asarray(rows, dtype=np.float32))


def test_sparse_rows_travel_as_an_index_frame_and_a_value_frame_beside_dense_ones() -> None:
    rows = sparse([[0, 1.5, 0, 0, 2], [0, 0, 0, 0, 0], [3, 0, 0, 0.25, 0]])
    more = sparse([[0, 0, 0, 9, 0]])
    dense = np.ones((1, 3), dtype=np.float32)
    outputs: list[tuple[PooledOutput, OutputRows]] = [
        (PooledOutput(1, 3, 5, nonzeros=[2, 0, 2]), rows),
        (PooledOutput(2, 1, 3), dense),
        (PooledOutput(3, 1, 5, nonzeros=[1]), more),
    ]
    frames = received(EngineWire().encode_outputs(outputs))
    assert len(frames) == 4  # the header, the dense rows, then every sparse output's indices and values
    np.testing.assert_array_equal(np.frombuffer(frames[1], dtype="<f4"), dense.reshape(-1))
    assert np.frombuffer(frames[2], dtype="<i4").tolist() == [1, 4, 0, 3, 3]
    assert np.frombuffer(frames[3], dtype="<f4").tolist() == [1.5, 2, 3, 0.25, 9]
    msg = ClientWire().decode(frames)
    assert isinstance(msg, Outputs) and msg.outputs == [out for out, _ in outputs]
    got_sparse, got_dense, got_more = decode_rows(msg, frames[1:])
    assert isinstance(got_sparse, SparseRows) and isinstance(got_more, SparseRows)
    np.testing.assert_array_equal(got_sparse.to_dense(), rows.to_dense())
    np.testing.assert_array_equal(got_more.to_dense(), more.to_dense())
    np.testing.assert_array_equal(got_sparse.dense_rows([2, 0]), rows.to_dense()[[2, 0]])
    assert got_sparse.row(1)[0].size == 0 and got_sparse.row(2)[0].tolist() == [0, 3]
    assert np.shares_memory(got_sparse.values, np.frombuffer(frames[3], dtype=np.uint8))
    np.testing.assert_array_equal(got_dense, dense)


def test_sparse_rows_whose_header_does_not_count_them_are_a_bug_caught_before_sending() -> None:
    rows = sparse([[0, 1, 1]])
    for out in (PooledOutput(1, 1, 3), PooledOutput(1, 1, 3, nonzeros=[1]), PooledOutput(1, 1, 4, nonzeros=[2])):
        with pytest.raises(ValueError, match="output 1"):
            EngineWire().encode_outputs([(out, rows)])


def indices(*values: int) -> bytes:
    return np.asarray(values, dtype="<i4").tobytes()


def values(count: int) -> bytes:
    return np.ones(count, dtype="<f4").tobytes()


@pytest.mark.parametrize(
    ("out", "frames", "reason"),
    [
        (PooledOutput(1, 1, 4, nonzeros=[2]), [indices(0, 1)], "need 2 data frame"),
        (PooledOutput(1, 2, 4, nonzeros=[2]), [indices(0, 1), values(2)], "of 1 rows, not 2"),
        (PooledOutput(1, 1, 4, nonzeros=[-1]), [b"", b""], "within 0..4"),
        (PooledOutput(1, 1, 4, nonzeros=[5]), [indices(*range(5)), values(5)], "within 0..4"),
        (PooledOutput(1, 1, 4, nonzeros=[2**64 - 1]), [b"", b""], "within 0..4"),
        (PooledOutput(1, 1, 4, nonzeros=[2]), [indices(0), values(1)], "2 int32 indices"),
        (PooledOutput(1, 1, 4, nonzeros=[2]), [indices(0, 1), values(3)], "2 indices and 3 values"),
        (PooledOutput(1, 1, 4, nonzeros=[1]), [indices(0, 1), values(2)], "more than the outputs"),
        (PooledOutput(1, 1, 4, nonzeros=[2]), [indices(0, 4), values(2)], "indices must be within 0..3"),
        (PooledOutput(1, 1, 4, nonzeros=[1]), [indices(-1), values(1)], "indices must be within 0..3"),
        (PooledOutput(1, 1, 4, nonzeros=[2]), [indices(2, 1), values(2)], "do not ascend"),
        (PooledOutput(1, 2, 4, nonzeros=[1, 2]), [indices(3, 1, 1), values(3)], "do not ascend"),
    ],
)
def test_sparse_frames_that_do_not_match_their_header_are_a_clear_protocol_error(
    out: PooledOutput, frames: list[bytes], reason: str
) -> None:
    with pytest.raises(ProtocolError, match=reason):
        decode_rows(Outputs([out]), frames)


def test_a_sparse_output_header_round_trips_and_a_dense_one_carries_no_counts() -> None:
    frames = received(EngineWire().encode_outputs([(PooledOutput(1, 1, 2), np.zeros((1, 2), dtype=np.float32))]))
    msg = ClientWire().decode(frames)
    assert isinstance(msg, Outputs) and msg.outputs[0].nonzeros is None


def test_a_late_interaction_text_has_a_vector_per_place_as_a_query_and_per_kept_token_as_a_document() -> None:
    """The one rule both ends cut a reply's frame by: a query is expanded to its floor; a document loses its
    skiplist tokens."""
    late = LateInteraction(expansion=5, skiplist_ids=[1012, 999])
    ids = np.asarray([101, 7, 1012, 8, 999, 102], dtype=np.int32)
    assert late.vector_count(ids, is_query=True) == 6  # already past the floor
    assert late.vector_count(ids[:3], is_query=True) == 5
    assert late.vector_count(ids, is_query=False) == 4
    assert LateInteraction().vector_count(ids, is_query=False) == 6


def test_bge_m3s_first_token_gives_no_vector_as_a_query_or_a_document() -> None:
    late = LateInteraction(similarity="meanmaxsim", drops_first=True)
    ids = np.asarray([0, 7, 8, 2], dtype=np.int32)
    assert late.vector_count(ids, is_query=True) == late.vector_count(ids, is_query=False) == 3
    assert late.vector_count(ids[:1], is_query=False) == 0


def test_an_array_fields_dtype_is_read_however_numpy_spells_its_annotation() -> None:
    """numpy 2.5 declares NDArray a `type` alias, which msgspec expands before its decode hook sees it: every request
    failed on the GPU machine (numpy 2.5.2) while the annotation's own object was the hook's key."""
    scalar = TypeVar("scalar", bound=np.generic)
    alias = TypeAliasType("NDArray", np.ndarray[tuple[Any, ...], np.dtype[scalar]], type_params=(scalar,))
    for spelled in (npt.NDArray[np.int32], np.ndarray[tuple[Any, ...], np.dtype[np.int32]], alias[np.int32]):
        assert array_dtype(spelled) == "<i4"
    assert array_dtype(np.ndarray[tuple[Any, ...], np.dtype[np.uint8]]) == "u1"
    for other in (npt.NDArray[np.float32], int, list[int], alias[np.float64]):
        assert array_dtype(other) is None
