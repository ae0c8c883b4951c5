"""A sparse model's vectors as clients get them: pruned as a request asks, then each as (index, value) pairs in
index order."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import numpy.typing as npt

from apiserver.errors import bad_request
from poolserve.model_card import ModelCard
from poolserve.protocol import SparseRows

I32 = npt.NDArray[np.int32]
F32 = npt.NDArray[np.float32]


def pruned(rows: SparseRows, top_k: int | None, threshold: float | None) -> Iterator[tuple[I32, F32]]:
    """Each row's entries above `threshold` (None: every non-zero one), then its `top_k` largest of those (None:
    all), in index order. Among equal values at the top-k cut the lower index is kept."""
    for i in range(rows.count):
        indices, values = rows.row(i)
        if threshold is not None:
            above = values > threshold
            indices, values = indices[above], values[above]
        if top_k is not None and top_k < len(values):
            kept = np.sort(np.argsort(-values, kind="stable")[:top_k])
            indices, values = indices[kept], values[kept]
        yield indices, values


def refuse_pruning_of_dense(card: ModelCard, top_k: int | None, threshold: float | None, *, sparse: bool) -> None:
    """Pruning means nothing to a dense vector: asked of a request whose answer is not sparse (`sparse`: a SPLADE
    model's, or bge-m3's lexical weights), it is refused by name."""
    if sparse:
        return
    for name, value in (("sparse_top_k", top_k), ("sparse_threshold", threshold)):
        if value is not None:
            what = (
                "this request asks for its dense output" if card.has_sparse_output else f"this is a {card.kind} model"
            )
            raise bad_request(f"`{name}` prunes sparse vectors; {what}.", param=name)
