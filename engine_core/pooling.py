"""Pooling token states into one vector per input, normalization and Matryoshka truncation."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import numpy.typing as npt
import torch

POOLING_MODES = ("mean", "cls", "last")


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

POOLERS: dict[str, Pooler] = {"mean": pool_mean, "cls": pool_cls, "last": pool_last}


def normalize(vectors: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.normalize(vectors, p=2.0, dim=-1)


def truncate_dimensions(
    vectors: npt.NDArray[np.float32], dimensions: int, renormalize: bool
) -> npt.NDArray[np.float32]:
    """Matryoshka truncation: keep the first `dimensions` values, re-normalized if the model normalizes."""
    if dimensions <= 0 or dimensions >= vectors.shape[1]:
        return vectors
    head = np.ascontiguousarray(vectors[:, :dimensions])
    if renormalize:
        norms = np.linalg.norm(head, axis=1, keepdims=True)
        np.maximum(norms, 1e-12, out=norms)
        head /= norms
    return head
