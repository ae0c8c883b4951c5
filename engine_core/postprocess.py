"""What happens to a request's raw rows once all are computed: normalization, Matryoshka, activations, and a
sparse model's max_active_dims."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from engine_core.runner import SparseRow
from poolserve.model_card import CLASSIFIER, SPARSE, ModelCard
from poolserve.protocol import SparseRows

F32 = npt.NDArray[np.float32]


def l2_normalize(rows: F32) -> F32:
    """As torch.nn.functional.normalize: divide by the norm, clamped away from zero.

    The norms come from one einsum rather than np.linalg.norm, whose checks and temporaries cost
    several times more on the one-row requests that make up most of an embedding server's work."""
    norms = np.sqrt(np.einsum("ij,ij->i", rows, rows))[:, None]
    np.maximum(norms, 1e-12, out=norms)
    normalized: F32 = (rows / norms).astype(np.float32, copy=False)
    return normalized


def truncate_dimensions(rows: F32, dimensions: int, renormalize: bool) -> F32:
    """Matryoshka truncation: keep the first `dimensions` values, re-normalized if the rows were."""
    if dimensions <= 0 or dimensions >= rows.shape[1]:
        return rows
    head = np.ascontiguousarray(rows[:, :dimensions])
    return l2_normalize(head) if renormalize else head


def sigmoid(rows: F32) -> F32:
    result: F32 = (1.0 / (1.0 + np.exp(-rows))).astype(np.float32, copy=False)
    return result


def softmax(rows: F32) -> F32:
    shifted = np.exp(rows - rows.max(axis=1, keepdims=True))
    result: F32 = (shifted / shifted.sum(axis=1, keepdims=True)).astype(np.float32, copy=False)
    return result


ACTIVATIONS = {"sigmoid": sigmoid, "softmax": softmax}


def finish_rows(rows: F32, card: ModelCard, *, normalize: bool, activation: bool, dimensions: int) -> F32:
    """A complete request's output rows, as the client asked for them. A sparse model's keep its max_active_dims
    largest values first, as SparseEncoder.encode keeps them, and are normalized after (a cosine compares what
    encode returns)."""
    if card.kind == SPARSE:
        rows = keep_largest(rows, card.max_active_dims)
        return l2_normalize(rows) if normalize else rows
    if card.kind == CLASSIFIER:
        function = ACTIVATIONS.get(card.activation)
        return function(rows) if activation and function is not None else rows
    if normalize:
        rows = l2_normalize(rows)
    return truncate_dimensions(rows, dimensions, renormalize=normalize)


def keep_largest(rows: F32, count: int) -> F32:
    """sentence-transformers' max_active_dims: the `count` values of largest magnitude in each row, the others
    set to zero; among equal magnitudes at the cut, the lower column is kept (torch.topk leaves that unsaid)."""
    if count <= 0 or count >= rows.shape[1]:
        return rows
    order = np.argsort(-np.abs(rows), axis=1, kind="stable")[:, :count]
    kept = np.zeros_like(rows)
    np.put_along_axis(kept, order, np.take_along_axis(rows, order, axis=1), axis=1)
    return kept


def finish_sparse_rows(parts: list[SparseRow], dim: int, *, normalize: bool) -> SparseRows:
    """A request's sparse rows from each input's entries (bge-m3's lexical weights), L2-normalized if asked."""
    nonzeros = np.fromiter((len(part.indices) for part in parts), dtype=np.int64, count=len(parts))
    indices = np.concatenate([part.indices for part in parts]).astype(np.int32, copy=False)
    values = np.concatenate([part.values for part in parts]).astype(np.float32, copy=False)
    if normalize and values.size:
        rows = np.repeat(np.arange(len(parts)), nonzeros)
        norms = np.sqrt(np.bincount(rows, weights=values.astype(np.float64) ** 2, minlength=len(parts)))
        values = (values / np.maximum(norms, 1e-12)[rows]).astype(np.float32)
    return SparseRows(nonzeros, indices, values, dim)
