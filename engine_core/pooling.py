"""Pooling the token states of each input into one vector (mean, CLS, last token)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

import torch

PoolingMode = Literal["mean", "cls", "last"]
POOLING_MODES: tuple[PoolingMode, ...] = ("mean", "cls", "last")


def pool_mean(hidden: torch.Tensor, mask: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """Average of the states of real (unmasked) tokens, as Sentence-Transformers' mean pooling."""
    weights = mask.unsqueeze(-1).to(hidden.dtype)
    summed = (hidden * weights).sum(dim=1)
    return summed / lengths.unsqueeze(-1).to(hidden.dtype).clamp(min=1)


def pool_cls(hidden: torch.Tensor, mask: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    return hidden[:, 0]


def pool_last(hidden: torch.Tensor, mask: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """State of each input's last real token; inputs are right-padded."""
    rows = torch.arange(hidden.shape[0], device=hidden.device)
    return hidden[rows, lengths - 1]


Pooler = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]

POOLERS: dict[PoolingMode, Pooler] = {"mean": pool_mean, "cls": pool_cls, "last": pool_last}
