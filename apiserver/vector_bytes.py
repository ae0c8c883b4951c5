"""Vectors as bytes: vLLM's `embed_dtype` and `endianness` for base64 answers, and Voyage's bit-packed
`binary`/`ubinary` types. numpy only (the API servers import no torch); the bytes equal torch's
conversions, which tests/apiserver/test_vector_bytes.py checks against torch itself."""

from __future__ import annotations

from typing import Literal

import numpy as np
import numpy.typing as npt

from apiserver.errors import bad_request

F32 = npt.NDArray[np.float32]
BYTE_ORDERS: dict[str, Literal["=", "<", ">"]] = {"native": "=", "little": "<", "big": ">"}
FLOAT_TYPES = {"float32": "f4", "float16": "f2"}

# Each dtype's width in bytes; the fp8 dtypes vLLM also defines are refused (refuse_unsupported_dtype).
DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}


def refuse_unsupported_dtype(embed_dtype: str) -> None:
    if embed_dtype not in DTYPE_BYTES:
        raise bad_request(
            f"`embed_dtype` {embed_dtype!r} is not supported by this server; use one of "
            f"{', '.join(map(repr, DTYPE_BYTES))}.",
            param="embed_dtype",
        )


def bfloat16_bits(rows: F32) -> npt.NDArray[np.uint16]:
    """bfloat16 bit patterns of float32 values, rounded to nearest even as torch rounds. A NaN becomes
    c10's quiet NaN 0x7FC0 (torch's vectorized CPU kernels write 0xFFFF: both decode as NaN)."""
    bits = np.ascontiguousarray(rows, dtype=np.float32).view(np.uint32)
    rounding = ((bits >> 16) & 1) + np.uint32(0x7FFF)
    # uint32 wraps past 0xFFFFFFFF only for NaN patterns, which are replaced below.
    with np.errstate(over="ignore"):
        rounded = ((bits + rounding) >> 16).astype(np.uint16)
    return np.where(np.isnan(rows), np.uint16(0x7FC0), rounded)


def row_bytes(rows: F32, embed_dtype: str, endianness: str) -> list[bytes]:
    """Each row's values in `embed_dtype`, in `endianness` byte order ("native": this machine's), as vLLM
    encodes them (vllm/utils/serial_utils.py: tensor2binary)."""
    order = BYTE_ORDERS[endianness]
    if embed_dtype == "bfloat16":
        data: npt.NDArray[np.generic] = bfloat16_bits(rows).astype(np.dtype(np.uint16).newbyteorder(order))
    else:
        # Past float16's range a value becomes infinity, as in torch: numpy warns of that, rightly here.
        with np.errstate(over="ignore"):
            data = np.asarray(rows).astype(np.dtype(FLOAT_TYPES[embed_dtype]).newbyteorder(order))
    return [row.tobytes() for row in data]


def packed_bits(rows: F32, *, signed: bool) -> npt.NDArray[np.int8] | npt.NDArray[np.uint8]:
    """Voyage's `ubinary`: one bit per value (1 where it is positive), eight to a byte, the first value in
    the highest bit; `binary`: the same bytes less 128 (offset binary), as int8."""
    packed = np.packbits(rows > 0, axis=1)
    if signed:
        return (packed.astype(np.int16) - 128).astype(np.int8)
    return packed
