"""vLLM's base64 dtypes and byte orders, and Voyage's packed bits, byte for byte against torch and numpy."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from apiserver.requests.vector_bytes import bfloat16_bits, packed_bits, row_bytes

TORCH_DTYPES = {
    "float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16,
    "fp8_e4m3": torch.float8_e4m3fn, "fp8_e5m2": torch.float8_e5m2,
}  # fmt: skip
VIEWS = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.float16}


def hard_values() -> np.ndarray:
    """Random values of every scale, and the cases rounding gets wrong: ties, subnormals, infinities, NaN,
    values that round up to infinity, and the largest finite floats."""
    rng = np.random.default_rng(7)
    scales = 10.0 ** rng.uniform(-45, 38, 4000)
    random = (rng.standard_normal(4000) * scales).astype(np.float32)
    ties = (np.arange(1, 2000, dtype=np.uint32) << 16 | 0x8000).view(np.float32)  # exactly half a bfloat16 step
    edges = np.array(
        [
            0.0,
            -0.0,
            np.inf,
            -np.inf,
            448.0,
            464.0,
            480.0,
            57344.0,
            61440.0,
            1e-45,
            -1e-45,
            6e-8,
            3e-8,
            65504.0,
            65520.0,
            3.4028235e38,
            -3.4028235e38,
        ],
        dtype=np.float32,
    )
    return np.concatenate([random, ties, -ties, edges]).reshape(1, -1)


@pytest.mark.parametrize("embed_dtype", list(TORCH_DTYPES))
@pytest.mark.parametrize("endianness", ["native", "little", "big"])
def test_bytes_are_torchs_as_vllm_encodes_them(embed_dtype: str, endianness: str) -> None:
    rows = hard_values()
    # vLLM's tensor2binary: to the dtype, viewed as 1-, 2- or 4-byte units, swapped unless native or native-equal.
    view = VIEWS.get(embed_dtype, torch.uint8)
    expected = torch.from_numpy(rows[0]).to(TORCH_DTYPES[embed_dtype]).view(view).numpy()
    if endianness == "big":
        expected = expected.byteswap()
    assert row_bytes(rows, embed_dtype, endianness) == [expected.tobytes()]


def test_bfloat16_rounds_to_nearest_even_and_a_nan_stays_nan() -> None:
    values = np.array([[1.0 + 2**-8, 1.0 + 3 * 2**-8, np.nan, -np.nan]], dtype=np.float32)
    assert bfloat16_bits(values).tolist() == [[0x3F80, 0x3F82, 0x7FC0, 0x7FC0]]
    for embed_dtype in ("float16", "bfloat16"):
        decoded = np.frombuffer(row_bytes(values, embed_dtype, "big")[0], dtype=">u2").astype(np.uint32) << 16
        halves = np.frombuffer(row_bytes(values, embed_dtype, "big")[0], dtype=">f2")
        nans = decoded.view(np.float32) if embed_dtype == "bfloat16" else halves
        assert np.isnan(nans[2:]).all()


def test_fp8_covers_every_byte_and_saturates_or_overflows_as_torch() -> None:
    every_byte = torch.arange(256, dtype=torch.uint8)
    for embed_dtype in ("fp8_e4m3", "fp8_e5m2"):
        values = every_byte.view(TORCH_DTYPES[embed_dtype]).to(torch.float32).numpy()
        finite = ~np.isnan(values)
        assert row_bytes(values[finite].reshape(1, -1), embed_dtype, "big") == [bytes(every_byte.numpy()[finite])]
    steps = np.linspace(-600, 600, 240_001, dtype=np.float32).reshape(1, -1)
    for embed_dtype in ("fp8_e4m3", "fp8_e5m2"):
        expected = torch.from_numpy(steps[0]).to(TORCH_DTYPES[embed_dtype]).view(torch.uint8).numpy()
        assert row_bytes(steps, embed_dtype, "native") == [expected.tobytes()]


def test_packed_bits_are_voyages_binary_and_ubinary() -> None:
    rows = np.array([[1, -1, 0.5, 0, -2, 3, 4, -5, 0.1, 0.1, 0.1, 0.1, 0.1, 0.1, 0.1, -0.1]], dtype=np.float32)
    ubinary = packed_bits(rows, signed=False)
    assert ubinary.tolist() == [[0b10100110, 0b11111110]]
    assert packed_bits(rows, signed=True).tolist() == [[0b10100110 - 128, 0b11111110 - 128]]
