"""Runs the model on one batch (texts or images) and returns one raw float32 row per input.

Raw means before the per-request steps (normalization, Matryoshka truncation, a classifier's
activation), which engine_core.postprocess applies once a request is complete. An input asked for
per token gets its token states instead (length x hidden), from the same forward pass.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple, Protocol

import numpy as np
import numpy.typing as npt
import torch

from engine_core.packed_encoder import packed_last_hidden_state, packed_logits
from engine_core.pixels import normalize_pixels
from engine_core.pooling import pooler_of, prompt_left_out
from poolserve.model_card import ImageProcessing

Rows = Sequence[npt.NDArray[np.int32]]
F32 = npt.NDArray[np.float32]
I32 = npt.NDArray[np.int32]


class SparseRow(NamedTuple):
    """One input's sparse output as a runner gives it (bge-m3's lexical weights: engine_core/bge_m3.py): its
    non-zero entries' column indices, ascending, and their values."""

    indices: I32
    values: F32

    @property
    def nbytes(self) -> int:
        return int(self.indices.nbytes + self.values.nbytes)


class ModelRunner(Protocol):
    def run_texts(self, rows: Rows, type_rows: Rows | None) -> F32: ...

    def run_texts_per_token(
        self, rows: Rows, type_rows: Rows | None, per_token: Sequence[bool], pool_from: Sequence[int] | None = None
    ) -> list[F32]:
        """Each input's pooled row, or where `per_token` says its token states. `pool_from`: where each input's
        pooling starts (a prompt the model's Pooling leaves out before it); the engine admits it only for a model
        whose card has prompt lengths, so only a pooling runner is ever given one."""
        ...

    def run_images(self, pixels: npt.NDArray[np.uint8]) -> npt.NDArray[np.float32]: ...


def to_device(array: npt.NDArray[Any], device: torch.device) -> torch.Tensor:
    """A host array on the model's device. For CUDA it is staged in page-locked memory first (torch's
    caching host allocator reuses those blocks), which lets the copy run asynchronously: without it a
    `non_blocking` copy from pageable memory waits for itself. On the CPU it is the array's own memory."""
    tensor = torch.from_numpy(array)
    if device.type == "cuda":
        return tensor.pin_memory().to(device, non_blocking=True)
    return tensor


class TextBatch:
    """Rows of token ids right-padded into tensors on the model's device (left-padded with `left`, as a causal
    model scored at its last position is), to the longest row or to `width` when that is longer (SigLIP's
    padding to its maximum length)."""

    def __init__(
        self,
        rows: Rows,
        type_rows: Rows | None,
        pad_token_id: int,
        device: torch.device,
        *,
        left: bool = False,
        width: int = 0,
    ):
        count = len(rows)
        lengths = np.fromiter((len(row) for row in rows), dtype=np.int64, count=count)
        width = max(int(lengths.max()), width)
        places = np.arange(width)[None, :]
        mask = places >= (width - lengths)[:, None] if left else places < lengths[:, None]
        # The mask's true cells, row by row, are where the concatenated rows go: one copy for the batch
        # rather than a slice assignment per row.
        input_ids = np.full((count, width), pad_token_id, dtype=np.int64)
        input_ids[mask] = np.concatenate(rows)
        self.input_ids = to_device(input_ids, device)
        self.mask = to_device(mask, device)
        self.attention_mask = self.mask.long()
        self.lengths = to_device(lengths, device)
        self.token_type_ids: torch.Tensor | None = None
        if type_rows is not None:
            token_types = np.zeros((count, width), dtype=np.int64)
            token_types[mask] = np.concatenate(type_rows)
            self.token_type_ids = to_device(token_types, device)

    def model_inputs(self) -> dict[str, torch.Tensor]:
        inputs = {"input_ids": self.input_ids, "attention_mask": self.attention_mask}
        if self.token_type_ids is not None:
            inputs["token_type_ids"] = self.token_type_ids
        return inputs


def to_numpy(rows: torch.Tensor) -> npt.NDArray[np.float32]:
    return rows.float().cpu().numpy()


class EmbeddingRunner:
    """An encoder or decoder (AutoModel) whose token states are pooled into one vector (sentence-transformers'
    pooling modes, concatenated), then run through the model's heads on the pooled rows (Dense, LayerNorm:
    engine_core/st_heads.py). `packed`: a BERT encoder run on its real tokens only (engine_core/packed_encoder.py)."""

    def __init__(
        self,
        model: torch.nn.Module,
        *,
        pooling: Sequence[str],
        pad_token_id: int,
        device: torch.device,
        packed: bool = False,
        heads: torch.nn.Module | None = None,
    ):
        self.model = model
        self.pooler = pooler_of(pooling)
        self.heads = heads
        self.pad_token_id = pad_token_id
        self.device = device
        self.packed = packed

    def run_texts(self, rows: Rows, type_rows: Rows | None) -> F32:
        with torch.inference_mode():
            hidden, batch = self._hidden(rows, type_rows)
            return to_numpy(self._pool(hidden, batch))

    def run_texts_per_token(
        self, rows: Rows, type_rows: Rows | None, per_token: Sequence[bool], pool_from: Sequence[int] | None = None
    ) -> list[F32]:
        """Each input's pooled row (from its token `pool_from[i]` on), or, where `per_token` says, its token states
        (length x hidden, every token's), from one forward pass."""
        with torch.inference_mode():
            hidden, batch = self._hidden(rows, type_rows)
            pooled = to_numpy(self._pool(hidden, batch, pool_from))
            if not any(per_token):
                return list(pooled)
            states = to_numpy(hidden)
            return [states[i, : len(row)] if per_token[i] else pooled[i] for i, row in enumerate(rows)]

    def _pool(self, hidden: torch.Tensor, batch: TextBatch, pool_from: Sequence[int] | None = None) -> torch.Tensor:
        mask = batch.mask if pool_from is None else prompt_left_out(batch.mask, pool_from)
        pooled = self.pooler(hidden, mask, batch.lengths)
        return pooled if self.heads is None else self.heads(pooled)

    def _hidden(self, rows: Rows, type_rows: Rows | None) -> tuple[torch.Tensor, TextBatch]:
        """The last hidden states in float32 (pooling is done in float32), and the batch they came from."""
        batch = TextBatch(rows, type_rows, self.pad_token_id, self.device)
        if self.packed:
            hidden = packed_last_hidden_state(self.model, batch.input_ids, batch.mask, batch.token_type_ids)
        else:
            hidden = self.model(**batch.model_inputs()).last_hidden_state
        return hidden.float(), batch

    def run_images(self, pixels: npt.NDArray[np.uint8]) -> npt.NDArray[np.float32]:
        raise TypeError("this model takes no images")


class ClassifierRunner:
    """A sequence-classification head (classifiers, cross-encoders): one logit per label. `packed`: a
    BERT classifier run on its real tokens only (engine_core/packed_encoder.py)."""

    def __init__(self, model: torch.nn.Module, *, pad_token_id: int, device: torch.device, packed: bool = False):
        self.model = model
        self.pad_token_id = pad_token_id
        self.device = device
        self.packed = packed

    def run_texts(self, rows: Rows, type_rows: Rows | None) -> F32:
        with torch.inference_mode():
            batch = TextBatch(rows, type_rows, self.pad_token_id, self.device)
            if self.packed:
                logits = packed_logits(self.model, batch.input_ids, batch.mask, batch.token_type_ids)
            else:
                logits = self.model(**batch.model_inputs()).logits
            return to_numpy(logits)

    def run_texts_per_token(
        self, rows: Rows, type_rows: Rows | None, per_token: Sequence[bool], pool_from: Sequence[int] | None = None
    ) -> list[F32]:
        raise TypeError("this model gives no token states")  # the engine refuses such requests first

    def run_images(self, pixels: npt.NDArray[np.uint8]) -> npt.NDArray[np.float32]:
        raise TypeError("this model takes no images")


class LogitScoreRunner:
    """A causal language model scored from its logits at each input's last token (sentence-transformers'
    LogitScore): logit(true) - logit(false), or logit(true) alone. Inputs are left-padded, as sentence-transformers
    pads them, so the last position is every input's last token and the model computes logits there only."""

    def __init__(
        self, model: torch.nn.Module, *, tokens: tuple[int, int | None], pad_token_id: int, device: torch.device
    ):
        self.model = model
        self.true_token, self.false_token = tokens
        self.pad_token_id = pad_token_id
        self.device = device

    def run_texts(self, rows: Rows, type_rows: Rows | None) -> F32:
        with torch.inference_mode():
            batch = TextBatch(rows, None, self.pad_token_id, self.device, left=True)
            logits = self.model(
                input_ids=batch.input_ids, attention_mask=batch.attention_mask, logits_to_keep=1
            ).logits[:, -1]
            scores = logits[:, self.true_token]
            if self.false_token is not None:
                scores = scores - logits[:, self.false_token]
            return to_numpy(scores.unsqueeze(1))

    def run_texts_per_token(
        self, rows: Rows, type_rows: Rows | None, per_token: Sequence[bool], pool_from: Sequence[int] | None = None
    ) -> list[F32]:
        raise TypeError("this model gives no token states")  # the engine refuses such requests first

    def run_images(self, pixels: npt.NDArray[np.uint8]) -> npt.NDArray[np.float32]:
        raise TypeError("this model takes no images")


class ClipRunner:
    """Text and image towers projected into one space (CLIP's and SigLIP's get_text_features /
    get_image_features). `text_padding`: every text padded to this many tokens on the tokenizer's side
    (`pad_left`), as SigLIP's texts are (`padding="max_length"`): its text tower reads the last position,
    padding or not, so the padding is part of the input; CLIP's pads only to the batch's longest text.
    `text_mask`: whether the text tower is given the attention mask (not where the tokenizer returns none)."""

    def __init__(
        self,
        model: Any,
        *,
        pad_token_id: int,
        device: torch.device,
        dtype: torch.dtype,
        image: ImageProcessing,
        text_padding: int = 0,
        pad_left: bool = False,
        text_mask: bool = True,
    ):
        self.model = model
        self.pad_token_id = pad_token_id
        self.device = device
        self.dtype = dtype
        self.image = image
        self.text_padding = text_padding
        self.pad_left = pad_left
        self.text_mask = text_mask

    def run_texts_per_token(
        self, rows: Rows, type_rows: Rows | None, per_token: Sequence[bool], pool_from: Sequence[int] | None = None
    ) -> list[F32]:
        raise TypeError("this model gives no token states")  # the engine refuses such requests first

    def run_texts(self, rows: Rows, type_rows: Rows | None) -> F32:
        with torch.inference_mode():
            batch = TextBatch(rows, None, self.pad_token_id, self.device, left=self.pad_left, width=self.text_padding)
            mask = batch.attention_mask if self.text_mask else None
            features = self.model.get_text_features(input_ids=batch.input_ids, attention_mask=mask)
            return to_numpy(features.pooler_output)

    def run_images(self, pixels: npt.NDArray[np.uint8]) -> npt.NDArray[np.float32]:
        with torch.inference_mode():
            # uint8 travels to the device: a quarter of the bytes of float32.
            on_device = to_device(pixels, self.device)
            pixel_values = normalize_pixels(on_device, self.image, self.dtype)
            features = self.model.get_image_features(pixel_values=pixel_values)
            return to_numpy(features.pooler_output)
