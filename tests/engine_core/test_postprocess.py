from __future__ import annotations

import msgspec
import numpy as np
import torch

from engine_core.postprocess import finish_rows, l2_normalize, sigmoid, softmax, truncate_dimensions
from tests.cards import CARD

RNG = np.random.default_rng(0)


def test_l2_normalize_equals_torch() -> None:
    rows = RNG.standard_normal((5, 7)).astype(np.float32)
    expected = torch.nn.functional.normalize(torch.from_numpy(rows), dim=-1).numpy()
    np.testing.assert_allclose(l2_normalize(rows), expected, rtol=1e-6)
    assert np.all(np.isfinite(l2_normalize(np.zeros((1, 3), dtype=np.float32))))


def test_matryoshka_truncation_keeps_the_head_and_renormalizes() -> None:
    rows = RNG.standard_normal((4, 16)).astype(np.float32)
    head = truncate_dimensions(rows, 6, renormalize=True)
    assert head.shape == (4, 6)
    np.testing.assert_allclose(np.linalg.norm(head, axis=1), 1.0, rtol=1e-6)
    np.testing.assert_allclose(head * np.linalg.norm(rows[:, :6], axis=1, keepdims=True), rows[:, :6], rtol=1e-5)


def test_matryoshka_truncation_without_normalization_only_cuts() -> None:
    rows = RNG.standard_normal((2, 8)).astype(np.float32)
    np.testing.assert_array_equal(truncate_dimensions(rows, 3, renormalize=False), rows[:, :3])
    assert truncate_dimensions(rows, 0, renormalize=True) is rows
    assert truncate_dimensions(rows, 8, renormalize=True) is rows


def test_activations_equal_torch() -> None:
    logits = RNG.standard_normal((6, 3)).astype(np.float32) * 4
    np.testing.assert_allclose(sigmoid(logits), torch.sigmoid(torch.from_numpy(logits)).numpy(), rtol=1e-6)
    np.testing.assert_allclose(softmax(logits), torch.softmax(torch.from_numpy(logits), dim=-1).numpy(), rtol=1e-6)


def test_finish_rows_per_model_kind() -> None:
    rows = RNG.standard_normal((3, 8)).astype(np.float32)
    normalized = finish_rows(rows, CARD, normalize=True, activation=True, dimensions=4)
    assert normalized.shape == (3, 4)
    np.testing.assert_allclose(np.linalg.norm(normalized, axis=1), 1.0, rtol=1e-6)
    np.testing.assert_array_equal(finish_rows(rows, CARD, normalize=False, activation=True, dimensions=0), rows)
    classifier = msgspec.structs.replace(CARD, kind="classifier", activation="softmax", labels=["a", "b"])
    logits = rows[:, :2]
    np.testing.assert_allclose(
        finish_rows(logits, classifier, normalize=True, activation=True, dimensions=0), softmax(logits)
    )
    np.testing.assert_array_equal(
        finish_rows(logits, classifier, normalize=True, activation=False, dimensions=0), logits
    )
