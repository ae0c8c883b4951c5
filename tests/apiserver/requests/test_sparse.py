"""apiserver/requests/sparse.py: a sparse model's vectors pruned as a request asks."""

from __future__ import annotations

import numpy as np

from apiserver.requests.sparse import pruned
from poolserve.protocol import SparseRows

ROWS = SparseRows.from_dense(np.asarray([[0, 0.5, 0.2, 0.9, 0.5, 0.1], [0, 0, 0, 0, 0, 0]], dtype=np.float32))


def entries(top_k: int | None, threshold: float | None) -> list[list[tuple[int, float]]]:
    return [
        list(zip(indices.tolist(), [round(value, 3) for value in values.tolist()], strict=True))
        for indices, values in pruned(ROWS, top_k, threshold)
    ]


def test_without_pruning_every_non_zero_entry_comes_in_index_order() -> None:
    assert entries(None, None) == [[(1, 0.5), (2, 0.2), (3, 0.9), (4, 0.5), (5, 0.1)], []]


def test_top_k_keeps_the_largest_in_index_order_and_the_lower_index_at_a_tie() -> None:
    assert entries(2, None) == [[(1, 0.5), (3, 0.9)], []]
    assert entries(10, None) == entries(None, None)


def test_a_threshold_keeps_the_values_above_it_then_top_k_applies() -> None:
    assert entries(None, 0.2) == [[(1, 0.5), (3, 0.9), (4, 0.5)], []]
    assert entries(1, 0.2) == [[(3, 0.9)], []]
    assert entries(None, 0.9) == [[], []]
