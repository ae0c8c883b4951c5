"""`--dtype auto` on a CPU: the rule, the agreement measure, and the bundled model in bf16 against fp32."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch
from tokenizers import Tokenizer

from engine_core import loader
from engine_core.cpu_precision import (
    PROBE_TEXTS,
    Agreement,
    choose_auto_dtype,
    has_avx512,
    has_native_bf16,
    measure_agreement,
)
from engine_core.load_model import load_model
from engine_core.loader import LoadedModel
from poolserve.config import Config

CLOSE = Agreement(min_cosine=0.999, top_overlap=1.0)
FAR = Agreement(min_cosine=0.95, top_overlap=1.0)
RESHUFFLED = Agreement(min_cosine=0.995, top_overlap=0.7)


@pytest.fixture(scope="module")
def fp32_model() -> LoadedModel:
    return load_model(Config(device="cpu", dtype="float32", runtime="torch"))


def never() -> Agreement:
    raise AssertionError("bf16 was measured where the rule needs no measurement")


def test_auto_is_float32_without_native_bf16_and_never_converts_the_model() -> None:
    dtype, reason = choose_auto_dtype(is_classifier=False, native_bf16=False, agreement=never)
    assert dtype == torch.float32 and "no native bfloat16" in reason


def test_auto_keeps_classifiers_in_float32() -> None:
    dtype, reason = choose_auto_dtype(is_classifier=True, native_bf16=True, agreement=never)
    assert dtype == torch.float32 and "classifier" in reason


@pytest.mark.parametrize(
    ("measured", "expected"), [(CLOSE, torch.bfloat16), (FAR, torch.float32), (RESHUFFLED, torch.float32)]
)
def test_auto_takes_bf16_only_when_the_model_agrees_on_both_measures(
    measured: Agreement, expected: torch.dtype
) -> None:
    dtype, reason = choose_auto_dtype(is_classifier=False, native_bf16=True, agreement=lambda: measured)
    assert dtype == expected
    assert f"{measured.min_cosine:.4f}" in reason


def test_agreement_sees_a_reordered_neighbourhood_that_cosine_alone_would_pass() -> None:
    rng = np.random.default_rng(0)
    reference = rng.standard_normal((32, 16)).astype(np.float32)
    assert measure_agreement(reference, reference) == Agreement(min_cosine=pytest.approx(1.0), top_overlap=1.0)
    # Every row moved by a little: cosine stays high, but near-ties between neighbours reorder.
    nudged = reference + 0.05 * rng.standard_normal(reference.shape).astype(np.float32)
    agreement = measure_agreement(reference, nudged)
    assert agreement.min_cosine > 0.99
    assert agreement.top_overlap < 1.0
    flipped = reference.copy()
    flipped[3] *= -1
    assert measure_agreement(reference, flipped).min_cosine == pytest.approx(-1.0)


def test_auto_on_a_bf16_processor_serves_the_bundled_model_in_bf16_and_logs_its_agreement(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, fp32_model: LoadedModel
) -> None:
    """The kept optimization held to fp32 eager: `auto` serves bf16 only after the model met the
    bound on the probe set, against its own float32 rows."""
    # This machine's CPU may lack native bf16 (emulated, it is slow, so the batch-cost fit is skipped).
    monkeypatch.setattr(loader, "has_native_bf16", lambda: True)
    monkeypatch.setattr(loader, "measure_batch_overhead", lambda runner, sample, max_model_len, **caps: 0.0)
    with caplog.at_level(logging.INFO, logger="poolserve.engine"):
        loaded = load_model(Config(device="cpu", dtype="auto"))
    assert loaded.card.dtype == "bfloat16"
    assert "--dtype auto chose bfloat16: native bfloat16 in this CPU and the model agrees" in caplog.text
    backend = Tokenizer.from_str(loaded.card.tokenizer_json)
    rows = [np.asarray(backend.encode(text).ids, dtype=np.int32) for text in PROBE_TEXTS[:8]]
    agreement = measure_agreement(fp32_model.runner.run_texts(rows, None), loaded.runner.run_texts(rows, None))
    assert 0.99 < agreement.min_cosine < 1.0


def test_auto_on_a_processor_without_bf16_serves_float32_and_logs_why(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(loader, "has_native_bf16", lambda: False)
    with caplog.at_level(logging.INFO, logger="poolserve.engine"):
        loaded = load_model(Config(device="cpu", dtype="auto"))
    assert loaded.card.dtype == "float32"
    assert "--dtype auto chose float32: this CPU has no native bfloat16" in caplog.text


def test_a_model_that_strays_in_bf16_is_served_from_float32_weights_reloaded(
    monkeypatch: pytest.MonkeyPatch, fp32_model: LoadedModel
) -> None:
    monkeypatch.setattr(loader, "has_native_bf16", lambda: True)
    monkeypatch.setattr(loader, "measure_agreement", lambda reference, candidate: FAR)
    monkeypatch.setattr(loader, "measure_batch_overhead", lambda runner, sample, max_model_len, **caps: 0.0)
    loaded = load_model(Config(device="cpu", dtype="auto", runtime="torch"))  # torch's weights, compared bit for bit
    assert loaded.card.dtype == "float32"
    row = [np.arange(101, 120, dtype=np.int32)]
    # Weights converted to bf16 and back would differ from float32's in their low bits.
    assert np.array_equal(loaded.runner.run_texts(row, None), fp32_model.runner.run_texts(row, None))


def test_no_native_bf16_where_onednn_is_held_below_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: True)  # a CPU that has it
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)
    monkeypatch.delenv("DNNL_MAX_CPU_ISA", raising=False)
    assert has_native_bf16()
    for cap in ("AVX2", "avx512_core_vnni", "AVX512_CORE"):
        monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", cap)
        assert not has_native_bf16(), cap
    for cap in ("ALL", "AVX512_CORE_BF16", "AVX512_CORE_AMX"):
        monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", cap)
        assert has_native_bf16(), cap
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA")
    monkeypatch.setenv("DNNL_MAX_CPU_ISA", "AVX2")  # oneDNN's older name for it
    assert not has_native_bf16()


def test_avx512_where_torch_dispatches_to_it_and_onednn_is_not_held_below_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)
    monkeypatch.delenv("DNNL_MAX_CPU_ISA", raising=False)
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX2")  # or ATEN_CPU_CAPABILITY=avx2
    assert not has_avx512()
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX512")
    assert has_avx512()
    for cap in ("AVX2", "avx2_vnni", "SSE41"):
        monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", cap)
        assert not has_avx512(), cap
    for cap in ("ALL", "AVX512_CORE", "AVX512_CORE_VNNI", "AVX512_CORE_AMX"):
        monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", cap)
        assert has_avx512(), cap
