from __future__ import annotations

import numpy as np
import torch

from engine_core.pooling import normalize, pool_cls, pool_last, pool_mean, truncate_dimensions


def batch() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    hidden = torch.randn(3, 5, 4)
    lengths = torch.tensor([5, 2, 3])
    mask = torch.arange(5)[None, :] < lengths[:, None]
    return hidden, mask, lengths


def test_mean_pooling_ignores_padding() -> None:
    hidden, mask, lengths = batch()
    pooled = pool_mean(hidden, mask, lengths)
    for i, n in enumerate(lengths.tolist()):
        torch.testing.assert_close(pooled[i], hidden[i, :n].mean(dim=0))


def test_cls_pooling_takes_the_first_token() -> None:
    hidden, mask, lengths = batch()
    torch.testing.assert_close(pool_cls(hidden, mask, lengths), hidden[:, 0])


def test_last_token_pooling_takes_each_inputs_last_real_token() -> None:
    hidden, mask, lengths = batch()
    pooled = pool_last(hidden, mask, lengths)
    for i, n in enumerate(lengths.tolist()):
        torch.testing.assert_close(pooled[i], hidden[i, n - 1])


def test_normalize_gives_unit_vectors() -> None:
    hidden, _, _ = batch()
    norms = normalize(hidden[:, 0]).norm(dim=-1)
    torch.testing.assert_close(norms, torch.ones(3))


def test_matryoshka_truncation_keeps_the_head_and_renormalizes() -> None:
    vectors = np.random.default_rng(0).standard_normal((4, 16)).astype(np.float32)
    head = truncate_dimensions(vectors, 6, renormalize=True)
    assert head.shape == (4, 6)
    np.testing.assert_allclose(np.linalg.norm(head, axis=1), 1.0, rtol=1e-6)
    np.testing.assert_allclose(
        head * np.linalg.norm(vectors[:, :6], axis=1, keepdims=True), vectors[:, :6], rtol=1e-5
    )


def test_matryoshka_truncation_without_normalization_only_cuts() -> None:
    vectors = np.random.default_rng(1).standard_normal((2, 8)).astype(np.float32)
    np.testing.assert_array_equal(truncate_dimensions(vectors, 3, renormalize=False), vectors[:, :3])
    assert truncate_dimensions(vectors, 0, renormalize=True) is vectors
    assert truncate_dimensions(vectors, 8, renormalize=True) is vectors
