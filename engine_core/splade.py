"""A SPLADE model (sentence-transformers' SparseEncoder): a masked LM's logits, log1p(relu(.)) per token, pooled
by max or sum over each input's tokens into one vocabulary-wide row, as SpladePooling computes it.

The logits of a batch are tokens x vocabulary (30522 for BERT): for 8,192 tokens that is 1 GB in float32,
most of it for a pooling that keeps one row per input. Where the model's MLM head is known (BERT, RoBERTa,
XLM-RoBERTa), the encoder runs once and the head runs on the real tokens only, a chunk at a time, each
chunk pooled into the rows before the next is computed: the same values, bounded memory, and no head
computed for padding. Any other masked LM runs whole and its logits are pooled the same way. Max pooling
keeps each entry's largest logit and transforms that once (log1p and relu are monotonic, so the weight of
the largest logit is the largest weight): one transform per vocabulary entry, not one per token.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
import torch

from engine_core.packed_encoder import packable, packed_last_hidden_state
from engine_core.runner import Rows, TextBatch, to_numpy
from engine_core.st_modules import SpladeOptions

F32 = npt.NDArray[np.float32]
# Tokens whose logits are held at once (x vocabulary x 4 bytes: 16 MB on a CPU, 500 MB on a GPU for BERT). On a
# CPU a chunk that stays in cache pays: 32 corpus sentences ran at 1026/s in chunks of 128 tokens against 420/s
# in chunks of 512 and 317/s of 64 (bench.harness.models' splade, one quiet run on the 2-core dev host). The GPU's is
# not measured.
CHUNK_TOKENS = {"cpu": 128, "cuda": 4096}
Head = Callable[[torch.Tensor], torch.Tensor]


def split_mlm(model: Any) -> tuple[torch.nn.Module, Head] | None:
    """The encoder and the MLM head of a masked LM whose forward is `head(encoder(...)[0])`; None for others."""
    name = type(model).__name__
    if name == "BertForMaskedLM":
        return model.bert, model.cls
    if name in ("RobertaForMaskedLM", "XLMRobertaForMaskedLM"):
        return model.roberta, model.lm_head
    return None


class SpladeRunner:
    """One float32 row of vocabulary size per input: SpladePooling over the model's MLM logits. `packed`: a
    BERT encoder run on its real tokens only (engine_core/packed_encoder.py)."""

    def __init__(
        self,
        model: torch.nn.Module,
        *,
        splade: SpladeOptions,
        vocab_size: int,
        pad_token_id: int,
        device: torch.device,
        packed: bool = False,
    ):
        self.model = model
        self.split = split_mlm(model)
        self.packed = packed and self.split is not None and packable(self.split[0])
        self.is_max = splade.pooling_strategy == "max"
        self.twice = splade.activation_function == "log1p_relu"
        self.vocab_size = vocab_size
        self.pad_token_id = pad_token_id
        self.device = device
        self.chunk = CHUNK_TOKENS.get(device.type, CHUNK_TOKENS["cuda"])

    def run_texts(self, rows: Rows, type_rows: Rows | None) -> F32:
        with torch.inference_mode():
            batch = TextBatch(rows, type_rows, self.pad_token_id, self.device)
            where = batch.mask.reshape(-1).nonzero().squeeze(1)  # the real tokens, input after input
            ends = np.cumsum([len(row) for row in rows]).tolist()
            # Max: the raw logits' maximum, from -inf; sum: the weights' sum, from zero.
            start_value = float("-inf") if self.is_max else 0.0
            pooled = torch.full((len(rows), self.vocab_size), start_value, dtype=torch.float32, device=self.device)
            if self.split is None:
                logits = self.model(**batch.model_inputs()).logits
                flat = logits.reshape(-1, logits.shape[-1])[where]
                for start in range(0, len(flat), self.chunk):
                    self._pool_into(pooled, flat[start : start + self.chunk], start, ends)
                return self._finish(pooled)
            encoder, head = self.split
            if self.packed:
                hidden = packed_last_hidden_state(encoder, batch.input_ids, batch.mask, batch.token_type_ids)
            else:
                hidden = encoder(**batch.model_inputs())[0]
            states = hidden.reshape(-1, hidden.shape[-1])[where]
            for start in range(0, len(states), self.chunk):
                self._pool_into(pooled, head(states[start : start + self.chunk]), start, ends)
            return self._finish(pooled)

    def _finish(self, pooled: torch.Tensor) -> F32:
        """The rows: for max pooling the weights of the maxima (the transform is monotonic, so the weight of the
        largest logit is the largest weight, and it is computed once per entry instead of once per token)."""
        return to_numpy(self._weights(pooled) if self.is_max else pooled)

    def _pool_into(self, pooled: torch.Tensor, logits: torch.Tensor, first: int, ends: list[int]) -> None:
        """The logits of tokens `first`.. (of the batch's real tokens, input after input, input i's ending at
        `ends[i]`) reduced into their inputs' rows: for max pooling the raw maximum (log1p and relu are
        monotonic: the maximum's weight is the maximum weight, see `finish`), for sum the sum of the weights."""
        last = first + len(logits)
        begin = 0
        for i, end in enumerate(ends):
            if end > first and begin < last:
                part = logits[max(begin, first) - first : min(end, last) - first].float()
                if self.is_max:
                    torch.maximum(pooled[i], part.amax(dim=0), out=pooled[i])
                else:
                    pooled[i] += self._weights(part).sum(dim=0)
            begin = end

    def _weights(self, logits: torch.Tensor) -> torch.Tensor:
        """SpladePooling's transform: log1p(relu(x)), log1p once more for "log1p_relu"."""
        weights = torch.log1p(torch.relu(logits))
        return torch.log1p(weights) if self.twice else weights

    def run_texts_per_token(
        self, rows: Rows, type_rows: Rows | None, per_token: Sequence[bool], pool_from: Sequence[int] | None = None
    ) -> list[F32]:
        raise TypeError("this model gives no token states")  # the engine refuses such requests first

    def run_images(self, pixels: npt.NDArray[np.uint8]) -> npt.NDArray[np.float32]:
        raise TypeError("this model takes no images")
