from __future__ import annotations

import pytest
import torch

from engine_core.pooling import pool_cls, pool_last, pool_mean, pooler_of, prompt_left_out
from engine_core.st_chain import ST_POOLING_MODES


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


@pytest.mark.parametrize("mode", ST_POOLING_MODES)
def test_a_prompt_left_out_of_pooling_is_pooled_as_sentence_transformers_pools_it(mode: str) -> None:
    """Pooling with include_prompt false: sentence-transformers' Pooling given the prompt's length (one per batch
    there; per input here, each input after its own prompt)."""
    from sentence_transformers.sentence_transformer.modules import Pooling

    hidden, mask, lengths = batch()
    reference = Pooling(4, pooling_mode=mode, include_prompt=False)
    pooled = pooler_of((mode,))(hidden, prompt_left_out(mask, [1, 1, 1]), lengths)
    features = {"token_embeddings": hidden, "attention_mask": mask.long(), "prompt_length": 1}
    torch.testing.assert_close(pooled, reference(features)["sentence_embedding"])
    # Per input: each row as its own batch with its own prompt's length.
    starts = [3, 1, 2]
    pooled = pooler_of((mode,))(hidden, prompt_left_out(mask, starts), lengths)
    for i, start in enumerate(starts):
        n = int(lengths[i])
        alone = {"token_embeddings": hidden[i : i + 1, :n], "attention_mask": mask[i : i + 1, :n].long(),
                 "prompt_length": start}  # fmt: skip
        torch.testing.assert_close(pooled[i : i + 1], reference(alone)["sentence_embedding"])
