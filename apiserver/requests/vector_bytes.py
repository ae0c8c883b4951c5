"""Vectors as bytes: vLLM's `embed_dtype` and `endianness` for base64 answers, and Voyage's bit-packed
`binary`/`ubinary` types. numpy only (the API servers import no torch); the bytes equal torch's
conversions, which tests/apiserver/requests/test_vector_bytes.py checks against torch itself."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np
import numpy.typing as npt

F32 = npt.NDArray[np.float32]
BYTE_ORDERS: dict[str, Literal["=", "<", ">"]] = {"native": "=", "little": "<", "big": ">"}
FLOAT_TYPES = {"float32": "f4", "float16": "f2"}


@dataclass(frozen=True, slots=True)
class Float8:
    """An 8-bit float's layout for c10's conversion from float32: values at or past `overflow` (float32
    bits) are out of range, those below `subnormal` become subnormals, and `overflow_byte` is what
    an out-of-range finite value becomes."""

    exponent_bias: int
    mantissa_shift: int  # float32 mantissa bits dropped
    overflow: int
    subnormal: int
    subnormal_magic: int  # float32 bits whose addition rounds a small value into fp8's subnormal grid
    overflow_byte: int


# torch.float8_e4m3fn (no infinities: torch saturates an out-of-range value to +-448, its largest) and
# torch.float8_e5m2 (out of range is infinity), as the torch this is tested against converts them.
FLOAT8 = {
    "fp8_e4m3": Float8(7, 20, 1087 << 20, 121 << 23, 141 << 23, 0x7E),
    "fp8_e5m2": Float8(15, 21, 143 << 23, 113 << 23, 134 << 23, 0x7C),
}
FLOAT32_INFINITY = 0x7F800000


def bfloat16_bits(rows: F32) -> npt.NDArray[np.uint16]:
    """bfloat16 bit patterns of float32 values, rounded to nearest even as torch rounds. A NaN becomes
    c10's quiet NaN 0x7FC0 (torch's vectorized CPU kernels write 0xFFFF: both decode as NaN)."""
    bits = np.ascontiguousarray(rows, dtype=np.float32).view(np.uint32)
    rounding = ((bits >> 16) & 1) + np.uint32(0x7FFF)
    # uint32 wraps past 0xFFFFFFFF only for NaN patterns, which are replaced below.
    with np.errstate(over="ignore"):
        rounded = ((bits + rounding) >> 16).astype(np.uint16)
    return np.where(np.isnan(rows), np.uint16(0x7FC0), rounded)


def float8_bits(rows: F32, layout: Float8) -> npt.NDArray[np.uint8]:
    """8-bit float bit patterns of float32 values, rounded to nearest even as c10 rounds (a NaN stays NaN)."""
    bits = np.ascontiguousarray(rows, dtype=np.float32).view(np.uint32)
    sign = bits & np.uint32(0x80000000)
    magnitude = bits ^ sign
    magic = np.uint32(layout.subnormal_magic)
    # A float32 addition rounds to fp8's subnormal grid (nearest even); its low byte is the pattern.
    subnormal = ((magnitude.view(np.float32) + magic.view(np.float32)).view(np.uint32) - magic) & 0xFF
    shift = layout.mantissa_shift
    rebias = np.uint32(((layout.exponent_bias - 127) << 23) & 0xFFFFFFFF)
    odd = (magnitude >> shift) & 1
    with np.errstate(over="ignore"):  # uint32 wraps as c10's does; the byte taken is right
        normal = ((magnitude + rebias + np.uint32((1 << (shift - 1)) - 1) + odd) >> shift) & 0xFF
    normal = np.minimum(normal, layout.overflow_byte)  # rounding up past the largest value overflows
    result = np.where(
        magnitude < layout.subnormal, subnormal, np.where(magnitude >= layout.overflow, layout.overflow_byte, normal)
    )
    result = np.where(magnitude > FLOAT32_INFINITY, 0x7F, result)
    patterns: npt.NDArray[np.uint8] = (result | (sign >> 24)).astype(np.uint8)
    return patterns


def row_bytes(rows: F32, embed_dtype: str, endianness: str) -> list[bytes]:
    """Each row's values in `embed_dtype`, in `endianness` byte order ("native": this machine's), as vLLM
    encodes them (vllm/utils/serial_utils.py: tensor2binary)."""
    order = BYTE_ORDERS[endianness]
    if embed_dtype in FLOAT8:
        data: npt.NDArray[np.generic] = float8_bits(rows, FLOAT8[embed_dtype])  # one byte: no byte order
    elif embed_dtype == "bfloat16":
        data = bfloat16_bits(rows).astype(np.dtype(np.uint16).newbyteorder(order))
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
