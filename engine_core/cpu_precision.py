"""`--dtype auto` on a CPU: bfloat16 where the processor computes it natively and the model's vectors
agree with float32's, else float32.

Why both conditions (docs/benchmarks.md, "CPU engine"): on a processor with AVX512_BF16 the bundled
model served 1.95x the sentences per second in bf16, with its vectors within cosine 0.996 of
fp32's; on one without (AVX2 only), torch emulates bf16 and the same batch took 5-7x as long as
in fp32. And a model's tolerance of bf16 is its own: the agreement is measured on the model being
loaded, on a fixed probe set, before it serves.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import torch

# The bound a bf16 model must meet on the probe set to be served under `--dtype auto`.
MIN_COSINE = 0.99
MIN_TOP_OVERLAP = 0.9
TOP_K = 10

# Varied lengths and topics, so that the neighbours of each are a ranking worth comparing.
PROBE_TEXTS = (
    "hello",
    "How do I reset my password?",
    "Forgotten passwords can be reset from the account settings page.",
    "What is the capital of France?",
    "Paris is the capital and most populous city of France.",
    "Berlin has been Germany's capital since reunification in 1990.",
    "A man is riding a horse along the beach at sunset.",
    "A woman is playing the violin in an orchestra.",
    "Two children build a sandcastle near the water.",
    "Vector databases store embeddings for fast nearest-neighbour search.",
    "Retrieval-augmented generation grounds a language model's answers in documents.",
    "The stock market fell 3.2% on Tuesday amid inflation fears.",
    "Central banks raised interest rates to slow rising prices.",
    "Photosynthesis converts light energy into chemical energy in plants.",
    "The mitochondria produce most of the cell's supply of ATP.",
    "In 1969, Apollo 11 landed the first humans on the Moon.",
    "Our refund policy allows returns within 30 days of purchase.",
    "Shipping is free for orders over fifty dollars.",
    "The recipe needs two cups of flour, sugar, butter and three eggs.",
    "Bake the cake at 180 degrees for forty minutes.",
    "Café, naïve, résumé and jalapeño carry accents.",
    "def add(a, b): return a + b",
    "The quick brown fox jumps over the lazy dog.",
    "Heavy rain and strong winds are expected along the coast tonight.",
    "The museum's new wing displays paintings from the Dutch golden age.",
    "Engineers repaired the bridge after the winter storms damaged its supports.",
    "A good night's sleep improves memory and concentration.",
    "The football match ended in a draw after extra time.",
    "Solar panels on the roof now cover most of the household's electricity.",
    "The committee approved the budget for next year's research projects.",
    "Please send the signed contract to the legal team by Friday.",
    "Train delays were caused by a signal failure near the central station.",
)


@dataclass(frozen=True, slots=True)
class Agreement:
    """How closely one precision's vectors follow float32's on the probe set."""

    min_cosine: float
    top_overlap: float  # mean share of each probe's TOP_K nearest probes that both precisions rank there

    @property
    def is_close(self) -> bool:
        return self.min_cosine >= MIN_COSINE and self.top_overlap >= MIN_TOP_OVERLAP


# oneDNN's instruction-set caps (its ONEDNN_MAX_CPU_ISA, or the older DNNL_MAX_CPU_ISA) below AVX512_CORE_BF16: held
# there, oneDNN multiplies no bf16 natively whatever the CPU's flags say.
CAPS_WITHOUT_BF16 = frozenset({"SSE41", "AVX", "AVX2", "AVX2_VNNI", "AVX2_VNNI_2", "AVX512_CORE", "AVX512_CORE_VNNI"})


def onednn_cap() -> str:
    """oneDNN's instruction-set cap as its environment variable sets it (upper case), or "" where none is set."""
    return (os.environ.get("ONEDNN_MAX_CPU_ISA") or os.environ.get("DNNL_MAX_CPU_ISA") or "").strip().upper()


def has_native_bf16() -> bool:
    """AVX512_BF16 or AMX: the processor multiplies bf16 itself instead of torch emulating it; not where oneDNN is held
    below them by its own environment variable."""
    if onednn_cap() in CAPS_WITHOUT_BF16:
        return False
    checks = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")
    return any(bool(getattr(torch.cpu, name, lambda: False)()) for name in checks)


# oneDNN's caps below AVX512_CORE: held there, its products run AVX2's kernels or older ones.
CAPS_BELOW_AVX512 = frozenset({"SSE41", "AVX", "AVX2", "AVX2_VNNI", "AVX2_VNNI_2"})


def has_avx512() -> bool:
    """Whether torch's packed float32 layers run AVX-512 here: torch's own kernels dispatch to it (its
    ATEN_CPU_CAPABILITY, where set, holds them lower) and oneDNN, which runs the products, is not held below it."""
    return torch.backends.cpu.get_cpu_capability() == "AVX512" and onednn_cap() not in CAPS_BELOW_AVX512


def unit_rows(rows: npt.NDArray[np.float32]) -> npt.NDArray[np.float64]:
    wide = rows.astype(np.float64)
    unit: npt.NDArray[np.float64] = wide / np.maximum(np.linalg.norm(wide, axis=1, keepdims=True), 1e-12)
    return unit


def nearest(unit: npt.NDArray[np.float64], k: int) -> list[set[int]]:
    """For each row, the k other rows most similar to it."""
    similarity = unit @ unit.T
    np.fill_diagonal(similarity, -np.inf)
    order = np.argsort(-similarity, axis=1, kind="stable")[:, :k]
    return [set(map(int, row)) for row in order]


def measure_agreement(reference: npt.NDArray[np.float32], candidate: npt.NDArray[np.float32]) -> Agreement:
    ref, cand = unit_rows(reference), unit_rows(candidate)
    min_cosine = float(np.min(np.sum(ref * cand, axis=1)))
    k = min(TOP_K, len(ref) - 1)
    overlaps = [len(a & b) / k for a, b in zip(nearest(ref, k), nearest(cand, k), strict=True)]
    return Agreement(min_cosine=min_cosine, top_overlap=float(np.mean(overlaps)))


def choose_auto_dtype(
    *, is_classifier: bool, native_bf16: bool, agreement: Callable[[], Agreement]
) -> tuple[torch.dtype, str]:
    """The dtype `--dtype auto` serves on a CPU, and the reason, for the start-up log.

    `agreement` converts the model to bf16 and measures it; it is called only when bf16 is in
    question. Classifiers stay float32: their scores meet thresholds users set, which a cosine
    bound says nothing about."""
    if is_classifier:
        return torch.float32, "classifier scores are served in float32"
    if not native_bf16:
        return torch.float32, "this CPU has no native bfloat16 (AVX512_BF16 or AMX): torch would emulate it, slower"
    measured = agreement()
    figures = f"probe min cosine {measured.min_cosine:.4f}, top-{TOP_K} overlap {measured.top_overlap:.3f}"
    if measured.is_close:
        return torch.bfloat16, f"native bfloat16 in this CPU and the model agrees with float32 ({figures})"
    bound = f"min cosine >= {MIN_COSINE}, top-{TOP_K} overlap >= {MIN_TOP_OVERLAP}"
    return torch.float32, f"the model in bfloat16 strays from float32 ({figures}; needs {bound})"
