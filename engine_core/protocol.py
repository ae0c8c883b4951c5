"""The wire between API servers and the engine core: msgspec messages plus raw array frames.

A message is a multipart ZeroMQ message: frame 0 is a msgpack-encoded Struct from the unions
below; arrays follow as raw little-endian frames (token ids int32, pooled outputs float32)
whose shapes the Struct carries. Nothing is pickled. New fields get defaults and go last
(msgspec's schema-evolution rules), so an API server and an engine one version apart still talk.
"""

from __future__ import annotations

import msgspec

TOKEN_DTYPE = "<i4"
OUTPUT_DTYPE = "<f4"
TOKEN_ITEMSIZE = 4
OUTPUT_ITEMSIZE = 4


class ModelCard(msgspec.Struct, kw_only=True, frozen=True):
    """What an API server needs to know of the model, told by the engine in its handshake."""

    path: str
    architecture: str
    tasks: list[str]
    max_model_len: int
    hidden_size: int
    vocab_size: int
    pooling: str
    normalize: bool
    pad_token_id: int
    # The model's fast tokenizer as transformers builds it (padding and truncation off), so an API
    # server tokenizes exactly as transformers would without importing it.
    tokenizer_json: str
    device: str
    dtype: str


# API server -> engine ---------------------------------------------------------------------


class Hello(msgspec.Struct, tag="hello", array_like=True):
    server_index: int
    pid: int


class PoolRequest(msgspec.Struct, tag="pool", array_like=True):
    """Pool `len(lengths)` inputs whose token ids follow, concatenated, in frame 1.

    A request travels and is batched as one unit however many inputs it has; `dimensions` 0
    means the model's full hidden size.
    """

    id: int
    lengths: list[int]
    dimensions: int = 0


class Abort(msgspec.Struct, tag="abort", array_like=True):
    ids: list[int]


class Ping(msgspec.Struct, tag="ping", array_like=True):
    nonce: int


ToEngine = Hello | PoolRequest | Abort | Ping


# engine -> API server ---------------------------------------------------------------------


class Ready(msgspec.Struct, tag="ready", array_like=True):
    card: ModelCard


class PooledOutput(msgspec.Struct, array_like=True):
    """One finished request: `rows` x `dim` float32 values in its own frame, or an error and an empty one."""

    id: int
    rows: int
    dim: int
    error: str = ""


class Outputs(msgspec.Struct, tag="outputs", array_like=True):
    """Finished requests for one API server, sent together; output i's data is frame i + 1."""

    outputs: list[PooledOutput]


class Pong(msgspec.Struct, tag="pong", array_like=True):
    nonce: int


FromEngine = Ready | Outputs | Pong


def make_encoder() -> msgspec.msgpack.Encoder:
    return msgspec.msgpack.Encoder()


def make_engine_decoder() -> msgspec.msgpack.Decoder[ToEngine]:
    """Decodes what the engine receives; built once per process and reused."""
    return msgspec.msgpack.Decoder(ToEngine)


def make_client_decoder() -> msgspec.msgpack.Decoder[FromEngine]:
    """Decodes what an API server receives; built once per process and reused."""
    return msgspec.msgpack.Decoder(FromEngine)
