"""What this test host's CPU can do, for tests that hold a CPU-dependent path where the CPU has it: these hosts
change between AVX512 (bf16, VNNI) and AVX2 only."""

from __future__ import annotations

import torch

from engine_core.packed_linear import PackedLinear


def bf16_packs() -> bool:
    """Whether oneDNN packs a bfloat16 weight on this CPU (it needs AVX512 BW, VL and DQ, or AVX-NE-CONVERT)."""
    try:
        PackedLinear(torch.nn.Linear(8, 8).bfloat16())
    except RuntimeError:
        return False
    return True


BF16_PACKS = bf16_packs()
NO_BF16_PACKING = "oneDNN packs no bfloat16 weight on this CPU (no AVX512 BW/VL/DQ, no AVX-NE-CONVERT)"
