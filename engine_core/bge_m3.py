"""bge-m3's two heads beside its dense embedding, as FlagEmbedding's BGEM3FlagModel computes them.

A bge-m3 folder (BAAI/bge-m3) is an XLM-RoBERTa whose Sentence-Transformers files give the dense embedding (CLS,
normalized), with `sparse_linear.pt` and `colbert_linear.pt` beside it (`torch.nn.Linear` state dicts). From the
same last hidden states:
- lexical weights (`_sparse_embedding`, `_process_token_weights`): `relu(sparse_linear(h))` per token, the largest
  weight of each token id, the ids of the tokenizer's cls, eos, pad and unk tokens and weights of 0 left out;
- ColBERT vectors (`_colbert_embedding`, `_process_colbert_vecs`): `colbert_linear(h)` of every token but the first
  (CLS), normalized like the dense vector (the request's normalization: engine_core/postprocess.py).
One forward pass serves a batch whatever each input asks for. FlagEmbedding loads the heads only when both files are
there (otherwise they are untrained); so does this.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

import numpy as np
import numpy.typing as npt
import torch
from transformers import PreTrainedTokenizerBase

from engine_core.folder_choices import LoadError, first_line
from engine_core.runner import F32, EmbeddingRunner, Rows, SparseRow, to_numpy
from poolserve.model_card import OUTPUT_MULTI_VECTOR, OUTPUT_SPARSE, LateInteraction, Output

SPARSE_HEAD = "sparse_linear.pt"
COLBERT_HEAD = "colbert_linear.pt"
# The special tokens whose weights _process_token_weights leaves out, where the tokenizer has them.
UNUSED_TOKENS = ("cls_token", "eos_token", "pad_token", "unk_token")
M3_OUTPUTS: list[Output] = [OUTPUT_SPARSE, OUTPUT_MULTI_VECTOR]


class M3Heads(NamedTuple):
    sparse: torch.nn.Linear
    colbert: torch.nn.Linear


def has_m3_heads(folder: Path) -> bool:
    return (folder / SPARSE_HEAD).is_file() and (folder / COLBERT_HEAD).is_file()


def read_linear(path: Path, hidden_size: int, out_features: int | None, device: torch.device) -> torch.nn.Linear:
    """A `torch.nn.Linear` state dict saved with torch.save (weights only), on `device` in float32."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:
        raise LoadError(f"cannot read {path}: {first_line(exc)}") from exc
    weight = state.get("weight") if isinstance(state, dict) else None
    if (
        not isinstance(weight, torch.Tensor)
        or weight.ndim != 2
        or weight.shape[1] != hidden_size
        or (out_features is not None and weight.shape[0] != out_features)
        or set(state) - {"weight", "bias"}
    ):
        raise LoadError(f"{path} is not the state of a Linear layer from the model's {hidden_size} values.")
    linear = torch.nn.Linear(hidden_size, int(weight.shape[0]), bias="bias" in state)
    linear.load_state_dict(state)
    return linear.to(device=device, dtype=torch.float32).eval()


def read_m3_heads(folder: Path, hidden_size: int, device: torch.device) -> M3Heads:
    return M3Heads(
        sparse=read_linear(folder / SPARSE_HEAD, hidden_size, 1, device),
        colbert=read_linear(folder / COLBERT_HEAD, hidden_size, None, device),
    )


def unused_token_ids(tokenizer: PreTrainedTokenizerBase) -> list[int]:
    """The ids _process_token_weights leaves out: those of the tokenizer's cls, eos, pad and unk tokens."""
    named = tokenizer.special_tokens_map
    ids = {tokenizer.convert_tokens_to_ids(named[name]) for name in UNUSED_TOKENS if name in named}
    return sorted(int(token_id) for token_id in ids if isinstance(token_id, int))


def m3_spec(max_model_len: int) -> LateInteraction:
    """The ColBERT vectors' treatment: no roles (queries and documents alike, no expansion, no skiplist), the first
    token's vector dropped, scored as BGEM3FlagModel.colbert_score does (MaxSim divided by the query's vectors)."""
    return LateInteraction(
        query_length=max_model_len, document_length=max_model_len, similarity="meanmaxsim", drops_first=True
    )


class M3Runner(EmbeddingRunner):
    """bge-m3: each input's dense row (the folder's pooling and heads), ColBERT vectors, or lexical weights."""

    def __init__(
        self,
        model: torch.nn.Module,
        *,
        m3: M3Heads,
        unused_ids: Sequence[int],
        pooling: Sequence[str],
        pad_token_id: int,
        device: torch.device,
        packed: bool = False,
        heads: torch.nn.Module | None = None,
    ):
        super().__init__(model, pooling=pooling, pad_token_id=pad_token_id, device=device, packed=packed, heads=heads)
        self.m3 = m3
        self.unused_ids = np.asarray(unused_ids, dtype=np.int64)

    def run_texts_per_token(
        self, rows: Rows, type_rows: Rows | None, per_token: Sequence[bool], pool_from: Sequence[int] | None = None
    ) -> list[F32]:
        if pool_from is not None and any(pool_from):  # the card has no prompt_lengths: admission refuses it first
            raise ValueError("bge-m3 pools every text from its first token")
        return self.run_outputs(rows, type_rows, per_token, [False] * len(rows))  # type: ignore[return-value]

    def run_outputs(
        self, rows: Rows, type_rows: Rows | None, per_token: Sequence[bool], sparse: Sequence[bool]
    ) -> list[F32 | SparseRow]:
        """Each input's dense row, its ColBERT vectors (`per_token`), or its lexical weights (`sparse`), from one
        forward pass."""
        with torch.inference_mode():
            hidden, batch = self._hidden(rows, type_rows)
            outputs: list[F32 | SparseRow | None] = [None] * len(rows)
            if not all(p or s for p, s in zip(per_token, sparse, strict=True)):
                pooled = to_numpy(self._pool(hidden, batch))  # pooling the whole batch costs less than cutting it
                for i in range(len(rows)):
                    if not (per_token[i] or sparse[i]):
                        outputs[i] = pooled[i]
            colbert = [i for i in range(len(rows)) if per_token[i]]
            if colbert:
                # One projection and one copy to the host for the batch's token vectors, cut per input after.
                vectors = to_numpy(self.m3.colbert(hidden[colbert, 1:]))
                for k, i in enumerate(colbert):
                    outputs[i] = vectors[k, : len(rows[i]) - 1]
            lexical = [i for i in range(len(rows)) if sparse[i]]
            if lexical:
                weights = to_numpy(torch.relu(self.m3.sparse(hidden[lexical])).squeeze(-1))
                for k, i in enumerate(lexical):
                    outputs[i] = self._lexical_weights(rows[i], weights[k, : len(rows[i])])
        assert all(output is not None for output in outputs)
        return outputs  # type: ignore[return-value]

    def _lexical_weights(self, ids: npt.NDArray[np.int32], weights: F32) -> SparseRow:
        """_process_token_weights: each token id's largest weight, the unused ids and weights of 0 left out."""
        kept = weights > 0
        if self.unused_ids.size:
            kept &= ~np.isin(ids, self.unused_ids)
        kept_ids, kept_weights = ids[kept], weights[kept]
        order = np.argsort(kept_ids, kind="stable")
        kept_ids, kept_weights = kept_ids[order], kept_weights[order]
        indices, starts = np.unique(kept_ids, return_index=True)
        values = np.maximum.reduceat(kept_weights, starts) if len(starts) else kept_weights[:0]
        return SparseRow(indices.astype(np.int32), values.astype(np.float32, copy=False))
