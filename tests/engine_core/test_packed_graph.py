"""engine_core/packed_graph.py: a batch laid end to end in rows (first fit, longest first), each input attending to
its own tokens only, and laid back on the padded batch's places; the graph given positions and that mask."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from engine_core.packed_graph import BLOCK_MASK, PACKED_WIDTH, pack_rows, packed_feed, packed_graph, unpacked


def places(lengths: list[int]) -> list[tuple[int, int, int]]:
    packed = pack_rows(np.asarray(lengths, dtype=np.int64))
    spans = list(zip(packed.row.tolist(), packed.start.tolist(), packed.length.tolist(), strict=True))
    for r in range(packed.rows):  # within the row's width, and no two inputs overlap
        taken = sorted((at, at + n) for row, at, n in spans if row == r)
        assert taken and taken[-1][1] <= packed.width
        assert all(end <= next_start for (_, end), (next_start, _) in itertools.pairwise(taken))
    return spans


def test_a_lone_input_is_one_row_of_its_own_tokens() -> None:
    packed = pack_rows(np.asarray([7]))
    assert (packed.rows, packed.width) == (1, 7)
    few = pack_rows(np.asarray([3, 4]))  # fewer tokens in all than a row holds: one row of them all
    assert (few.rows, few.width) == (1, 7)


def test_short_inputs_share_rows_of_the_width_longest_first() -> None:
    spans = places([10, 30, 60, 5, 12])
    assert pack_rows(np.asarray([10, 30, 60, 5, 12])).width == PACKED_WIDTH
    # 60 opens row 0; 30 row 1; 12 and 10 fit beside 30; 5 fits nowhere else but row 1 (60 + 5 > 64)
    assert spans == [(1, 42, 10), (1, 0, 30), (0, 0, 60), (1, 52, 5), (1, 30, 12)]


def test_an_input_longer_than_the_width_widens_the_rows() -> None:
    spans = places([20, 100, 70, 20, 10])
    assert pack_rows(np.asarray([20, 100, 70, 20, 10])).width == 100
    # 100 fills row 0; 70, 20 and 10 fill row 1; the second 20 opens row 2
    assert [row for row, _, _ in spans] == [1, 0, 1, 2, 1]


def test_the_feed_gives_each_input_its_own_positions_and_a_block_of_its_own_tokens() -> None:
    lengths = np.asarray([3, 5, 2])
    ids = np.zeros((3, 5), dtype=np.int64)
    for i, n in enumerate(lengths):
        ids[i, :n] = 100 * (i + 1) + np.arange(n)
    packed = pack_rows(lengths)
    feed = packed_feed(packed, ids, None)
    mask = feed[BLOCK_MASK]
    assert mask.shape == (packed.rows, packed.width, packed.width) and int(mask.sum()) == 9 + 25 + 4
    for i, (r, at, n) in enumerate(zip(packed.row, packed.start, packed.length, strict=True)):
        assert feed["input_ids"][r, at : at + n].tolist() == ids[i, :n].tolist()
        assert feed["position_ids"][r, at : at + n].tolist() == list(range(n))
        assert mask[r, at : at + n, at : at + n].all()
    hidden = np.arange(packed.rows * packed.width * 2, dtype=np.float32).reshape(packed.rows, packed.width, 2)
    back = unpacked(packed, hidden, 5)
    for i, (r, at, n) in enumerate(zip(packed.row, packed.start, packed.length, strict=True)):
        assert np.array_equal(back[i, :n], hidden[r, at : at + n])
        assert not back[i, n:].any()  # zeros at the padding, as the padded forward's pooling expects


def test_a_graph_without_fused_bert_embeddings_is_refused(tmp_path: Path) -> None:
    graph = helper.make_graph(
        [helper.make_node("Identity", ["input_ids"], ["last_hidden_state"])],
        "not-bert",
        [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "sequence"])],
        [helper.make_tensor_value_info("last_hidden_state", TensorProto.INT64, ["batch", "sequence"])],
    )
    onnx.save(helper.make_model(graph), str(tmp_path / "model.onnx"))
    with pytest.raises(ValueError, match="no fused BERT embeddings and attention"):
        packed_graph(tmp_path / "model.onnx")
    assert not (tmp_path / "packed.onnx").exists()
