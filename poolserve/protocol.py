"""The wire between API servers and the engine core: its messages, their frames, and their encoding.

A message is a multipart ZeroMQ message: frame 0 is a msgpack-encoded Struct from the tagged unions
below; arrays follow as raw little-endian frames (token ids int32, pixels uint8, pooled rows float32; a sparse
model's rows as an int32 index frame and a float32 value frame) whose shapes the Struct carries. A request goes
as one message of its own; the engine answers what one step finished for an API server as one `Outputs`, every
dense output's rows in one frame. Nothing is pickled. Every process comes from one install, so both ends always
run this same module and no field has to stay readable by an older peer. Each end builds its codec (`ClientWire`,
`EngineWire`) once and reuses it, as msgspec advises.
"""

from __future__ import annotations

import functools
import itertools
import math
import typing
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final, Literal, TypeVar

import msgspec
import numpy as np
import numpy.typing as npt

from poolserve.model_card import ModelCard

TOKEN_DTYPE: Final = "<i4"
OUTPUT_DTYPE: Final = "<f4"
TOKEN_ITEMSIZE: Final = 4
OUTPUT_ITEMSIZE: Final = 4
INT64_MAX: Final = 2**63 - 1

I32 = npt.NDArray[np.int32]
F32 = npt.NDArray[np.float32]
U8 = npt.NDArray[np.uint8]
# What arrives (bytes from a socket, or any buffer), and what goes out: headers as bytes, arrays as
# flat byte views of their memory (sent without a copy).
Buffer = bytes | bytearray | memoryview
Frame = bytes | memoryview
T = TypeVar("T")


class ProtocolError(ValueError):
    """A message that breaks this module's layout: undecodable, or frames that do not match its header."""


# Why the engine refused or failed a request.
ErrorCode = Literal["invalid", "overloaded", "model_error"]
ERROR_INVALID: Final = "invalid"
ERROR_OVERLOADED: Final = "overloaded"
ERROR_MODEL: Final = "model_error"


# API server -> engine ---------------------------------------------------------------------


class Hello(msgspec.Struct, tag="hello", array_like=True, frozen=True):
    server_index: int
    pid: int


# A request's priority (lower runs sooner) fits in 32 bits, as the API validates it.
PRIORITY_MIN, PRIORITY_MAX = -(2**31), 2**31 - 1


class PoolingParams(msgspec.Struct, array_like=True, kw_only=True):
    """How a request's inputs are pooled and its rows finished: each option declared here alone, set by the API
    server as it parses a request and read by the engine where it applies it (vLLM's PoolingParams).

    `dimensions` 0 means the full output size; `normalize` None means the model's own choice (the engine resolves it
    on admission); `activation` applies a classifier's activation to its logits. `per_token`: every token's hidden
    state instead of one pooled row per input (texts only; normalization and `dimensions` apply per token).
    `queries`: on a late-interaction model, how many of the first text inputs are queries (the others are
    documents); each input's rows are then its token vectors (`LateInteraction.vector_count` of them). On a Router
    model (`ModelCard.default_route`), how many of the first text inputs take the query's chain (the others take
    the document's). `sparse`: the model's sparse output (bge-m3's lexical weights, `ModelCard.extra_outputs`)
    instead of its own. `pool_from`: where pooling starts in each text input, the tokens before it a prompt the
    model's Pooling leaves out (`ModelCard.prompt_lengths`); empty: every input's pooling starts at its first token.
    """

    dimensions: int = 0
    normalize: bool | None = None
    activation: bool = True
    per_token: bool = False
    queries: int = 0
    sparse: bool = False
    pool_from: list[int] = msgspec.field(default_factory=list)


def _no_tokens() -> I32:
    return np.zeros(0, dtype=TOKEN_DTYPE)


class EngineRequest(msgspec.Struct, tag="pool", array_like=True, kw_only=True):
    """One request: `len(lengths)` text inputs and `len(pixels)` images, run as one unit (vLLM's EngineCoreRequest).

    The API server builds it once (`from_rows`) and the engine client sends it as it is: its arrays travel as data
    frames after the header (the wire's codecs put each array in a frame of its own and write its frame and shape in
    its place), and arrive as read-only views of those frames. `tokens`: the token ids of every text input,
    concatenated (int32), cut into inputs by `lengths`; `token_types`: their token type ids in the same layout;
    `pixels`: the images (images x height x width x 3, uint8). Output rows come back texts first, then images, each
    in the order sent.

    `id` is the engine client's, given as it sends the request. `attempt` counts resubmissions after engine
    crashes: a resubmitted request was admitted already (no queue limit applies), and one that was running when an
    engine died runs in batches of its own (`is_suspect`), so that a second crash names the culprit. `priority`:
    lower runs sooner (engine_core/scheduler.py says how). `traced`: the request is in a sampled trace, so the
    engine reports the forward passes it rode in (`PooledOutput.passes`) for the API server to draw as spans.
    """

    id: int = 0
    lengths: list[int] = msgspec.field(default_factory=list)
    tokens: I32 = msgspec.field(default_factory=_no_tokens)
    token_types: I32 | None = None
    pixels: U8 | None = None
    params: PoolingParams = msgspec.field(default_factory=PoolingParams)
    priority: int = 0
    traced: bool = False
    attempt: int = 0
    is_suspect: bool = False

    @classmethod
    def from_rows(
        cls,
        rows: Sequence[Sequence[int]],
        type_rows: Sequence[Sequence[int]] | None = None,
        images: Sequence[U8] = (),
        *,
        params: PoolingParams | None = None,
        priority: int = 0,
        traced: bool = False,
    ) -> EngineRequest:
        """A request from token rows (as a tokenizer gives them) and images (height x width x 3 each, one size)."""
        lengths = [len(row) for row in rows]
        total = sum(lengths)  # a numpy reduction costs microseconds however short the array
        tokens = np.fromiter(itertools.chain.from_iterable(rows), dtype=TOKEN_DTYPE, count=total)
        token_types = None
        if type_rows is not None:
            token_types = np.fromiter(itertools.chain.from_iterable(type_rows), dtype=TOKEN_DTYPE, count=total)
        pixels = np.stack(images).astype(np.uint8, copy=False) if len(images) else None
        return cls(
            lengths=lengths,
            tokens=tokens,
            token_types=token_types,
            pixels=pixels,
            params=PoolingParams() if params is None else params,
            priority=priority,
            traced=traced,
        )

    @property
    def images(self) -> int:
        return 0 if self.pixels is None else len(self.pixels)

    @property
    def count(self) -> int:
        """How many inputs the request holds: texts and images."""
        return len(self.lengths) + self.images


class Abort(msgspec.Struct, tag="abort", array_like=True, frozen=True):
    ids: list[int]


class Ping(msgspec.Struct, tag="ping", array_like=True, frozen=True):
    nonce: int


ToEngine = Hello | EngineRequest | Abort | Ping

# The dtype each array field of a request travels in, by its annotation's scalar type.
SCALAR_DTYPES: Final[dict[object, str]] = {np.int32: TOKEN_DTYPE, np.uint8: "u1"}
ARRAY_ITEMSIZES: Final = {TOKEN_DTYPE: TOKEN_ITEMSIZE, "u1": 1}


@functools.cache
def array_dtype(kind: object) -> str | None:
    """The wire dtype of an array field, from its annotation as msgspec hands it to the decode hook: `NDArray[np.int32]`
    as written, or expanded to `ndarray[tuple[Any, ...], dtype[np.int32]]` (numpy 2.5 declares `NDArray` a `type`
    alias, which msgspec expands, so the annotation's own object never arrives); None for anything else."""
    args = typing.get_args(kind)
    for arg in args:
        if arg in SCALAR_DTYPES:
            return SCALAR_DTYPES[arg]
    return next((dtype for dtype in map(array_dtype, args) if dtype is not None), None)


def check_layout(request: EngineRequest) -> EngineRequest:
    """The request, when its arrays fit its lengths and its values fit the wire's ranges; ProtocolError when not.
    Whether the model can take them is the engine's check, not the wire's."""
    listed = request.lengths
    if not (listed or request.pixels is not None):
        raise ProtocolError("no inputs")
    # Checked on the decoded list of Python ints: a numpy reduction costs ~2 µs however short the array,
    # and most requests hold one input.
    shortest, longest = (min(listed), max(listed)) if listed else (1, 0)
    if longest > INT64_MAX:  # msgpack integers reach 2**64 - 1
        raise ProtocolError("input lengths must be within 1..2**63 - 1")
    if shortest < 1:
        raise ProtocolError("input lengths must be at least 1")
    tokens = request.tokens
    if tokens.ndim != 1 or longest > tokens.size or sum(listed) != tokens.size:
        raise ProtocolError("token frame size does not match the lengths")
    if request.token_types is not None and request.token_types.shape != tokens.shape:
        raise ProtocolError("the token type frame does not match the token frame")
    pixels = request.pixels
    if pixels is not None and (pixels.ndim != 4 or pixels.shape[3] != 3 or 0 in pixels.shape):
        raise ProtocolError("the pixel frame must hold images of height x width x 3 bytes")
    params = request.params
    if not 0 <= params.queries <= len(listed):
        raise ProtocolError("queries must be within 0..the number of text inputs")
    if not PRIORITY_MIN <= request.priority <= PRIORITY_MAX:
        raise ProtocolError(f"priority must be within {PRIORITY_MIN}..{PRIORITY_MAX}")
    if params.pool_from and (
        len(params.pool_from) != len(listed)
        or any(not 0 <= start < length for start, length in zip(params.pool_from, listed, strict=True))
    ):
        raise ProtocolError("pool_from must hold one start per text input, each before the input's last token")
    return request


# engine -> API server ---------------------------------------------------------------------


class Ready(msgspec.Struct, tag="ready", array_like=True, frozen=True):
    """The handshake's answer. `suspects`: ids of this API server's requests that were running
    in a forward pass when the previous engine died."""

    card: ModelCard
    suspects: list[int] = msgspec.field(default_factory=list)


class ForwardPass(msgspec.Struct, array_like=True, frozen=True):
    """One forward pass a traced request rode in, as the engine timed it: wall-clock nanoseconds (the API server
    draws it as a span; both ends read one host's clock), the whole batch's inputs, real tokens and tokens with
    padding, and how many of the batch's inputs were this request's."""

    start_ns: int
    end_ns: int
    batch_inputs: int
    batch_tokens: int
    padded_tokens: int
    request_inputs: int


class PooledOutput(msgspec.Struct, array_like=True, frozen=True):
    """One finished request, whose `rows` x `dim` float32 values are the next `rows * dim` of its message's dense
    frame; or, when `nonzeros` is not None (a sparse model), whose rows are the next entries of its message's two
    sparse frames: the column indices (int32, ascending within a row) and the values (float32) of every row's
    non-zero entries, row after row, `nonzeros[i]` of them for row i."""

    id: int
    rows: int
    dim: int
    # Seconds between admission and the first forward pass, and from there to the last one.
    queue_time: float = 0.0
    inference_time: float = 0.0
    # Inputs answered from the engine's cache, without a forward pass.
    cached: int = 0
    nonzeros: list[int] | None = None
    # A traced request's forward passes, in the order they ran (EngineRequest.traced); None for any other.
    passes: list[ForwardPass] | None = None


class RequestFailed(msgspec.Struct, array_like=True, frozen=True):
    """A request the engine refused or failed, and why; it has no frame."""

    id: int
    code: ErrorCode
    message: str


class Outputs(msgspec.Struct, tag="outputs", array_like=True, frozen=True):
    """What finished for one API server in one step, sent together as soon as the step's rows are ready. Data frames
    follow: when there is a dense output, one frame holding every dense output's float32 rows back to back, in the
    order of `outputs`; then, when there is a sparse output, one frame of every sparse output's int32 indices and one
    of their float32 values, back to back in the same order (`decode_rows`). A frame per output cost a send and a
    receive each (docs/benchmarks.md, "Answers batched back")."""

    outputs: list[PooledOutput] = msgspec.field(default_factory=list)
    failures: list[RequestFailed] = msgspec.field(default_factory=list)


class Pong(msgspec.Struct, tag="pong", array_like=True, frozen=True):
    """The answer to a Ping, from the engine's I/O thread, with the scheduler's state: how long it
    has been inside one step (a hung forward pass shows here), and what is waiting."""

    nonce: int
    stalled_for: float = 0.0
    queued_inputs: int = 0
    queued_tokens: int = 0


FromEngine = Ready | Outputs | Pong


@dataclass(frozen=True, slots=True, eq=False)
class SparseRows:
    """`len(nonzeros)` rows of `dim` values of which only the non-zero ones are held: row i's are
    `indices[offsets[i]:offsets[i + 1]]` (ascending) and the `values` at the same places."""

    nonzeros: npt.NDArray[np.int64]
    indices: I32
    values: F32
    dim: int

    @classmethod
    def from_dense(cls, rows: F32) -> SparseRows:
        """The non-zero entries of dense rows, each row's in column order."""
        where_rows, where_columns = np.nonzero(rows)
        nonzeros = np.bincount(where_rows, minlength=rows.shape[0]).astype(np.int64)
        return cls(nonzeros, where_columns.astype(np.int32), rows[where_rows, where_columns], rows.shape[1])

    @property
    def count(self) -> int:
        return len(self.nonzeros)

    @property
    def offsets(self) -> npt.NDArray[np.int64]:
        offsets = np.zeros(len(self.nonzeros) + 1, dtype=np.int64)
        np.cumsum(self.nonzeros, out=offsets[1:])
        return offsets

    def row(self, i: int) -> tuple[I32, F32]:
        start, end = self.offsets[i : i + 2]
        return self.indices[start:end], self.values[start:end]

    def dense_rows(self, which: Sequence[int] | npt.NDArray[np.int64]) -> F32:
        """The rows `which` names, dense (every column), in that order."""
        offsets = self.offsets
        dense = np.zeros((len(which), self.dim), dtype=np.float32)
        for k, i in enumerate(which):
            start, end = offsets[i], offsets[i + 1]
            dense[k, self.indices[start:end]] = self.values[start:end]
        return dense

    def to_dense(self) -> F32:
        dense = np.zeros((self.count, self.dim), dtype=np.float32)
        dense[np.repeat(np.arange(self.count), self.nonzeros), self.indices] = self.values
        return dense


# One request's output: dense rows, or a sparse model's.
OutputRows = F32 | SparseRows


def decode_rows(msg: Outputs, frames: Sequence[Buffer]) -> list[OutputRows]:
    """Each output's rows, as read-only views of the message's data frames (no copy); ProtocolError when they do
    not fit the headers."""
    outputs = msg.outputs
    sparse_count = sum(out.nonzeros is not None for out in outputs)
    has_dense, has_sparse = sparse_count < len(outputs), sparse_count > 0
    expected = int(has_dense) + 2 * int(has_sparse)
    if len(frames) != expected:
        raise ProtocolError(f"{len(outputs)} output(s) need {expected} data frame(s), came with {len(frames)}")
    try:
        dense = np.frombuffer(frames[0], dtype=OUTPUT_DTYPE) if has_dense else _NO_VALUES
        indices = np.frombuffer(frames[-2], dtype=TOKEN_DTYPE) if has_sparse else _NO_INDICES
        values = np.frombuffer(frames[-1], dtype=OUTPUT_DTYPE) if has_sparse else _NO_VALUES
    except ValueError:
        raise ProtocolError("a data frame does not hold whole 4-byte values") from None
    if indices.size != values.size:
        raise ProtocolError(f"the sparse frames hold {indices.size} indices and {values.size} values")
    rows: list[OutputRows] = []
    dense_at = sparse_at = 0
    for out in outputs:
        if out.nonzeros is not None:
            sparse, sparse_at = decode_sparse(out, indices, values, sparse_at)
            rows.append(sparse)
            continue
        end = dense_at + out.rows * out.dim
        if out.rows < 0 or out.dim < 0 or end > dense.size:
            raise ProtocolError(f"output {out.id}'s rows of {out.rows}x{out.dim} float32 values are not in its frame")
        rows.append(dense[dense_at:end].reshape(out.rows, out.dim))
        dense_at = end
    if dense_at != dense.size or sparse_at != indices.size:
        raise ProtocolError("the data frames hold more than the outputs count")
    return rows


_NO_VALUES: Final[F32] = np.zeros(0, dtype=OUTPUT_DTYPE)
_NO_INDICES: Final[I32] = np.zeros(0, dtype=TOKEN_DTYPE)


def decode_sparse(out: PooledOutput, indices: I32, values: F32, at: int) -> tuple[SparseRows, int]:
    """The sparse output's rows, its entries from `at` on in the message's sparse frames, and where the next
    output's entries start."""
    assert out.nonzeros is not None
    if out.dim < 0 or len(out.nonzeros) != out.rows:
        raise ProtocolError(f"output {out.id} counts the non-zeros of {len(out.nonzeros)} rows, not {out.rows}")
    try:
        nonzeros = np.asarray(out.nonzeros, dtype=np.int64)
    except OverflowError:
        raise ProtocolError(f"output {out.id}'s non-zero counts must be within 0..{out.dim}") from None
    if nonzeros.size and (nonzeros.min() < 0 or nonzeros.max() > out.dim):
        raise ProtocolError(f"output {out.id}'s non-zero counts must be within 0..{out.dim}")
    end = at + int(nonzeros.sum())
    if end > indices.size:
        raise ProtocolError(f"output {out.id}'s {end - at} int32 indices and float32 values are not in its frames")
    own = indices[at:end]
    if own.size and (own.min() < 0 or own.max() >= out.dim):
        raise ProtocolError(f"output {out.id}'s indices must be within 0..{out.dim - 1}")
    # Within a row the indices ascend: a step that does not is a row's first entry, or a broken frame.
    row_starts = np.cumsum(nonzeros)[:-1]
    steps_down = np.flatnonzero(np.diff(own) <= 0) + 1
    if not np.isin(steps_down, row_starts).all():
        raise ProtocolError(f"output {out.id}'s indices do not ascend within each row")
    return SparseRows(nonzeros, own, values[at:end], out.dim), end


def byte_view(array: npt.NDArray[np.generic]) -> memoryview:
    """A C-contiguous array's memory as a flat byte view (len() counts bytes, as for a received frame)."""
    return array.data.cast("B")


# The two ends -------------------------------------------------------------------------------


def decode_header(decoder: msgspec.msgpack.Decoder[T], frames: Sequence[Buffer]) -> T:
    if not frames:
        raise ProtocolError("a message with no frames")
    try:
        return decoder.decode(frames[0])
    except msgspec.DecodeError as exc:  # ValidationError is a DecodeError too
        raise ProtocolError(str(exc)) from exc


class ClientWire:
    """An API server's end: encodes what it sends the engine (a request's arrays as frames of their own, each
    written in the header as `[frame, *shape]`), decodes what comes back."""

    def __init__(self) -> None:
        self._encoder = msgspec.msgpack.Encoder(enc_hook=self._put_array)
        self._decoder: msgspec.msgpack.Decoder[FromEngine] = msgspec.msgpack.Decoder(FromEngine)
        self._arrays: list[Frame] = []

    def encode(self, msg: Hello | EngineRequest | Abort | Ping) -> list[Frame]:
        """The message's frames: its header, then a request's arrays as flat byte views, sent without a copy."""
        arrays: list[Frame] = []
        self._arrays = arrays
        header = self._encoder.encode(msg)
        return [header, *arrays] if arrays else [header]

    def _put_array(self, obj: object) -> list[int]:
        if not isinstance(obj, np.ndarray):
            raise NotImplementedError(f"{type(obj).__name__} has no place on the wire")
        array = np.ascontiguousarray(obj)
        self._arrays.append(byte_view(array.reshape(-1)))  # flat: a memoryview will not cast a shape with a 0 in it
        return [len(self._arrays), *array.shape]

    def decode(self, frames: Sequence[Buffer]) -> FromEngine:
        """The message in frame 0; an Outputs message's rows are `decode_rows(msg, frames[1:])`."""
        return decode_header(self._decoder, frames)


class EngineWire:
    """The engine's end: decodes what API servers send (a request's arrays as read-only views of its frames, no
    copy, checked against its lengths: `check_layout`), encodes its answers."""

    def __init__(self) -> None:
        self._encoder = msgspec.msgpack.Encoder()
        self._decoder: msgspec.msgpack.Decoder[ToEngine] = msgspec.msgpack.Decoder(ToEngine, dec_hook=self._get_array)
        self._frames: Sequence[Buffer] = ()
        self._taken = 0

    def encode(self, msg: Ready | Pong) -> list[Frame]:
        return [self._encoder.encode(msg)]

    def encode_outputs(
        self, outputs: Sequence[tuple[PooledOutput, OutputRows]], failures: Sequence[RequestFailed] = ()
    ) -> list[Frame]:
        """Finished requests with their rows (each `out.rows` x `out.dim`, dense or sparse), and failed ones, as one
        message (see Outputs)."""
        dense: list[F32] = []
        indices: list[I32] = []
        values: list[F32] = []
        for out, rows in outputs:
            if isinstance(rows, SparseRows):
                if out.nonzeros is None or rows.nonzeros.tolist() != out.nonzeros or rows.dim != out.dim:
                    raise ValueError(f"output {out.id}'s header does not count its sparse rows")
                indices.append(rows.indices)
                values.append(rows.values)
                continue
            if out.nonzeros is not None or rows.shape != (out.rows, out.dim):
                raise ValueError(f"output {out.id} has rows of shape {rows.shape}, not {out.rows}x{out.dim}")
            dense.append(rows)
        frames: list[Frame] = [self._encoder.encode(Outputs([out for out, _ in outputs], list(failures)))]
        # One copy of every output's rows, flattened and cast where they need it, in one numpy call; a lone output's
        # rows go as they are when they are float32 and contiguous already.
        if len(dense) == 1:
            frames.append(byte_view(np.ascontiguousarray(dense[0], dtype=OUTPUT_DTYPE).reshape(-1)))
        elif dense:
            frames.append(byte_view(np.concatenate(dense, axis=None, dtype=OUTPUT_DTYPE)))
        if indices:
            frames.append(byte_view(np.concatenate(indices, axis=None, dtype=TOKEN_DTYPE)))
            frames.append(byte_view(np.concatenate(values, axis=None, dtype=OUTPUT_DTYPE)))
        return frames

    def decode(self, frames: Sequence[Buffer]) -> ToEngine:
        """The message in frame 0, a request's arrays read from the frames after it; ProtocolError when they do
        not match its header."""
        self._frames, self._taken = frames, 0
        try:
            msg = decode_header(self._decoder, frames)
        finally:
            self._frames = ()
        if not isinstance(msg, EngineRequest):
            return msg
        if self._taken != len(frames) - 1:
            raise ProtocolError(f"expected {self._taken} data frame(s), got {len(frames) - 1}")
        return check_layout(msg)

    def _get_array(self, kind: type, obj: object) -> npt.NDArray[np.generic]:
        """The array a header names by `[frame, *shape]`: frames are taken in order, each once."""
        dtype = array_dtype(kind)
        if dtype is None or not isinstance(obj, list) or not all(type(n) is int and n >= 0 for n in obj):
            raise ValueError(f"expected an array as [frame, *shape], got {obj!r}")
        self._taken += 1
        sent = len(self._frames) - 1
        if not obj or obj[0] != self._taken or self._taken > sent:
            raise ValueError(f"an array names data frame {obj[0] if obj else None}: not the next data frame of {sent}")
        frame, shape = self._frames[self._taken], obj[1:]
        if memoryview(frame).nbytes != math.prod(shape) * ARRAY_ITEMSIZES[dtype]:
            raise ValueError(f"data frame {self._taken} does not hold {'x'.join(map(str, shape))} {dtype} values")
        array = np.frombuffer(frame, dtype=dtype)
        return array.reshape(shape)

    def request_id_of(self, frames: Sequence[Buffer]) -> int | None:
        """The id of an EngineRequest whose header does not decode (a field of the wrong type) or whose frames do not
        match it, so that its sender gets a failure instead of waiting for its timeout; None for anything else."""
        try:
            header = msgspec.msgpack.decode(frames[0]) if frames else None
        except msgspec.DecodeError:
            return None
        if not (isinstance(header, list) and len(header) > 1 and header[0] == EngineRequest.__struct_config__.tag):
            return None
        return header[1] if type(header[1]) is int else None
