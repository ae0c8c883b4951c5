"""A SPLADE model (sentence-transformers' SparseEncoder): a masked LM's logits, log1p(relu(.)) per token, pooled
by max or sum over each input's tokens into one vocabulary-wide row, as SpladePooling computes it.

The logits of a batch are tokens x vocabulary (30522 for BERT): for 8,192 tokens that is 1 GB in float32,
most of it for a pooling that keeps one row per input. Where the model's MLM head is known (BERT, RoBERTa,
XLM-RoBERTa), the encoder runs once and the head runs on the real tokens only, a chunk at a time, each
chunk pooled into the rows before the next is computed: the same values, bounded memory, and no head
computed for padding. Any other masked LM runs whole and its logits are pooled the same way.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
import torch

from engine_core.packed_encoder import packable, packed_last_hidden_state
from engine_core.runner import Rows, TextBatch, to_numpy
from engine_core.st_folder import SpladeOptions

F32 = npt.NDArray[np.float32]
# Tokens whose logits are held at once (x vocabulary x 4 bytes): 60 MB on a CPU, 500 MB on a GPU for BERT.
CHUNK_TOKENS = {"cpu": 512, "cuda": 4096}
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
            # Every weight is >= 0 and every input has a token, so zeros start the max as -inf would.
            pooled = torch.zeros((len(rows), self.vocab_size), dtype=torch.float32, device=self.device)
            if self.split is None:
                logits = self.model(**batch.model_inputs()).logits
                flat = logits.reshape(-1, logits.shape[-1])[where]
                for start in range(0, len(flat), self.chunk):
                    self._pool_into(pooled, flat[start : start + self.chunk], start, ends)
                return to_numpy(pooled)
            encoder, head = self.split
            if self.packed:
                hidden = packed_last_hidden_state(encoder, batch.input_ids, batch.mask, batch.token_type_ids)
            else:
                hidden = encoder(**batch.model_inputs())[0]
            states = hidden.reshape(-1, hidden.shape[-1])[where]
            for start in range(0, len(states), self.chunk):
                self._pool_into(pooled, head(states[start : start + self.chunk]), start, ends)
            return to_numpy(pooled)

    def _pool_into(self, pooled: torch.Tensor, logits: torch.Tensor, first: int, ends: list[int]) -> None:
        """SpladePooling's transform of the logits of tokens `first`.. (of the batch's real tokens, input after
        input, input i's ending at `ends[i]`), reduced into their inputs' rows."""
        weights = torch.log1p(torch.relu(logits.float()))
        if self.twice:
            weights = torch.log1p(weights)
        last = first + len(weights)
        begin = 0
        for i, end in enumerate(ends):
            if end > first and begin < last:
                part = weights[max(begin, first) - first : min(end, last) - first]
                if self.is_max:
                    torch.maximum(pooled[i], part.amax(dim=0), out=pooled[i])
                else:
                    pooled[i] += part.sum(dim=0)
            begin = end

    def run_texts_per_token(self, rows: Rows, type_rows: Rows | None, per_token: Sequence[bool]) -> list[F32]:
        raise TypeError("this model gives no token states")  # the engine refuses such requests first

    def run_images(self, pixels: npt.NDArray[np.uint8]) -> npt.NDArray[np.float32]:
        raise TypeError("this model takes no images")
