from __future__ import annotations

import torch

from engine_core.pooling import pool_cls, pool_last, pool_mean


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
