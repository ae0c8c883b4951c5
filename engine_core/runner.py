"""Runs the model on one batch of token-id rows and returns one pooled float32 vector per row."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt
import torch

from engine_core.pooling import POOLERS, normalize


class ModelRunner:
    def __init__(
        self,
        model: torch.nn.Module,
        *,
        pooling: str,
        normalize: bool,
        pad_token_id: int,
        device: torch.device,
    ):
        self.model = model
        self.pooler = POOLERS[pooling]
        self.normalize = normalize
        self.pad_token_id = pad_token_id
        self.device = device

    def embed(self, rows: Sequence[npt.NDArray[np.int32]]) -> npt.NDArray[np.float32]:
        """Pool each row of token ids (right-padded into one batch) into one vector."""
        count = len(rows)
        lengths = np.fromiter((len(row) for row in rows), dtype=np.int64, count=count)
        width = int(lengths.max())
        input_ids = np.full((count, width), self.pad_token_id, dtype=np.int64)
        for i, row in enumerate(rows):
            input_ids[i, : len(row)] = row
        mask = np.arange(width)[None, :] < lengths[:, None]
        with torch.inference_mode():
            ids_t = torch.from_numpy(input_ids).to(self.device, non_blocking=True)
            mask_t = torch.from_numpy(mask).to(self.device, non_blocking=True)
            lengths_t = torch.from_numpy(lengths).to(self.device, non_blocking=True)
            hidden = self.model(input_ids=ids_t, attention_mask=mask_t.long()).last_hidden_state
            pooled = self.pooler(hidden.float(), mask_t, lengths_t)
            if self.normalize:
                pooled = normalize(pooled)
            return pooled.cpu().numpy()
