"""Pooling the token states of each input into one vector, as sentence-transformers' Pooling module does.

Every mode it has (cls, max, mean, mean_sqrt_len_tokens, weightedmean, lasttoken), several of them
concatenated in the order given, over every token or, with `include_prompt: false`, the tokens after the
prompt. Inputs are right-padded (engine_core/runner.py), so a row's real tokens are its first `length`;
sentence-transformers' own arithmetic is kept where it changes the float result (a mean divides the masked
sum by the count clamped at 1e-9).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

# The --pooling flag's names (poolserve.config.Pooling) in sentence-transformers' terms.
FLAG_MODES: dict[str, str] = {"mean": "mean", "cls": "cls", "last": "lasttoken"}


def pool_cls(hidden: torch.Tensor, mask: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """State of each input's first pooled token (its first, unless a prompt is left out: `prompt_left_out`)."""
    rows = torch.arange(hidden.shape[0], device=hidden.device)
    return hidden[rows, mask.to(torch.int32).argmax(dim=1)]


def pool_max(hidden: torch.Tensor, mask: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    return hidden.masked_fill(~mask.unsqueeze(-1), float("-inf")).max(dim=1).values


def masked_sum_and_count(hidden: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    weights = mask.unsqueeze(-1).to(hidden.dtype)
    return (hidden * weights).sum(dim=1), torch.clamp(weights.sum(dim=1), min=1e-9)


def pool_mean(hidden: torch.Tensor, mask: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """Average of the states of real (unmasked) tokens."""
    summed, count = masked_sum_and_count(hidden, mask)
    return summed / count


def pool_mean_sqrt_len(hidden: torch.Tensor, mask: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    summed, count = masked_sum_and_count(hidden, mask)
    return summed / torch.sqrt(count)


def pool_weighted_mean(hidden: torch.Tensor, mask: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """Token i (from 1) weighs i: later tokens count more (SGPT's position-weighted mean)."""
    positions = torch.arange(1, hidden.shape[1] + 1, device=hidden.device, dtype=hidden.dtype).view(1, -1, 1)
    weights = mask.unsqueeze(-1).to(hidden.dtype) * positions
    return (hidden * weights).sum(dim=1) / torch.clamp(weights.sum(dim=1), min=1e-9)


def pool_last(hidden: torch.Tensor, mask: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """State of each input's last real token (after any prompt left out: inputs are longer than their prompt)."""
    rows = torch.arange(hidden.shape[0], device=hidden.device)
    return hidden[rows, lengths - 1]


def prompt_left_out(mask: torch.Tensor, pool_from: Sequence[int]) -> torch.Tensor:
    """The mask of the tokens pooled when input i's first `pool_from[i]` tokens are a prompt the Pooling leaves out
    (`include_prompt: false`), as sentence-transformers zeroes them in the mask it pools by: the mean and max over
    the rest, CLS the first token after the prompt, the weighted mean weighing the rest by their own positions."""
    starts = torch.as_tensor(pool_from, device=mask.device).unsqueeze(1)
    return mask & (torch.arange(mask.shape[1], device=mask.device).unsqueeze(0) >= starts)


Pooler = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]

POOLERS: dict[str, Pooler] = {
    "cls": pool_cls,
    "max": pool_max,
    "mean": pool_mean,
    "mean_sqrt_len_tokens": pool_mean_sqrt_len,
    "weightedmean": pool_weighted_mean,
    "lasttoken": pool_last,
}


def pooler_of(modes: Sequence[str]) -> Pooler:
    """One pooler for sentence-transformers' modes, their vectors concatenated in the order given."""
    poolers = [POOLERS[mode] for mode in modes]
    if len(poolers) == 1:
        return poolers[0]

    def pool(hidden: torch.Tensor, mask: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        return torch.cat([pooler(hidden, mask, lengths) for pooler in poolers], dim=-1)

    return pool
