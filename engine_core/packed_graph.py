"""ONNX Runtime's fused BERT graph run on packed rows: a batch's inputs laid end to end in rows of about
PACKED_WIDTH tokens, each attending to its own tokens only, so the graph computes almost no padding.

Why (docs/benchmarks.md, "The graph on packed rows"): the padded graph computes every input to the batch's longest,
which cost it its lead over torch's packed modules from a few sentences on (a batch of 16 corpus sentences pads 459
real tokens to 704). Laid end to end in rows of 64, the same graph runs 16 sentences in ~0.7 of torch's packed time
on a 2-core AVX2 CPU, and two in ~0.6 of the padded graph's.

How: the optimised graph (engine_core/onnx_runtime.py) computes positions from 0 in each row, and its Attention
nodes read the row's padding from the EmbedLayerNormalization node's mask index. `packed_graph` gives the
EmbedLayerNormalization node each token's position as an input (each input's own, from 0) and every Attention node a
block-diagonal mask (rows x width x width: 1 where a token may attend) in place of the mask index; ONNX Runtime's CPU
Attention takes such a mask as it is. Everything else is the graph as it was optimised, so the weights, fusions and
kernels are those the start-up probe holds to torch float32 (engine_core/loader.py).
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

# A row's width when the inputs are shorter: rows of 64 ran 16 and 32 corpus sentences fastest of 64, 96, 128 and
# 256 (docs/benchmarks.md); an input longer than that gets a row of its length, which the shorter ones share.
PACKED_WIDTH = 64
POSITIONS = "position_ids"
BLOCK_MASK = "block_mask"
# The packed graph's name, beside the cached graph it is made from.
PACKED_NAME = "packed.onnx"
# Its weights, in a file beside it, each at an offset a multiple of a page: ONNX Runtime maps such a tensor from the
# file instead of copying it into memory, so the graph's two sessions share the pages of the weights they do not
# repack (the word embeddings, read only where a token's row is) and the engine holds ~80 MB less for MiniLM
# (docs/benchmarks.md, "The graph's weights mapped from a file").
WEIGHTS_NAME = PACKED_NAME + ".data"
PAGE = 4096
# A tensor smaller than this stays in the graph itself.
SMALLEST_APART = PAGE


def packed_graph(graph: Path) -> Path:
    """`graph` (optimised) with positions and a block mask as inputs, written beside it once with its weights in
    WEIGHTS_NAME beside that (the export's temporary folder, engine_core/onnx_runtime.py's cached_graph, which keeps
    only these two); ValueError where the graph's embeddings and attention were not fused as BERT's (nothing to give
    the positions and mask to)."""
    import onnx
    from onnx import TensorProto, helper

    target = graph.with_name(PACKED_NAME)
    if target.is_file():
        return target
    model = onnx.load(str(graph))  # its weights read in, wherever the optimiser stored them
    nodes = model.graph.node
    embeddings = [node for node in nodes if node.op_type == "EmbedLayerNormalization"]
    attention = [node for node in nodes if node.op_type == "Attention"]
    if len(embeddings) != 1 or not attention:
        raise ValueError("its ONNX graph has no fused BERT embeddings and attention to pack rows for")
    (embedding,) = embeddings
    mask_index = embedding.output[1] if len(embedding.output) > 1 else ""
    if not mask_index or any(len(node.input) < 4 or node.input[3] != mask_index for node in attention):
        raise ValueError("its ONNX graph's attention does not read the embeddings' mask index")
    while len(embedding.input) < 9:
        embedding.input.append("")
    embedding.input[8] = POSITIONS  # EmbedLayerNormalization's optional position_ids
    for node in attention:
        node.input[3] = BLOCK_MASK  # a raw mask, rows x width x width
    model.graph.input.append(helper.make_tensor_value_info(POSITIONS, TensorProto.INT32, ["rows", "width"]))
    model.graph.input.append(helper.make_tensor_value_info(BLOCK_MASK, TensorProto.INT32, ["rows", "width", "width"]))
    weights = target.with_name(WEIGHTS_NAME)
    store_apart(model, weights)
    with tempfile.NamedTemporaryFile(dir=graph.parent, suffix=".onnx", delete=False) as file:
        written = Path(file.name)
    try:
        onnx.save(model, str(written))
        mode = graph.stat().st_mode & 0o777  # readable as the graph is (a temporary file is its owner's only)
        written.chmod(mode)
        weights.chmod(mode)
        os.replace(written, target)
    finally:
        written.unlink(missing_ok=True)
    return target


def store_apart(model: Any, path: Path) -> None:
    """Every tensor of `model` of at least SMALLEST_APART bytes written to `path`, each from a multiple of PAGE, and
    referred to there (ONNX's external data, named relative to the graph beside it)."""
    from onnx import TensorProto
    from onnx.external_data_helper import set_external_data

    with path.open("wb") as file:
        for tensor in model.graph.initializer:
            if len(tensor.raw_data) < SMALLEST_APART:
                continue
            file.write(bytes(-file.tell() % PAGE))
            offset = file.tell()
            file.write(tensor.raw_data)
            set_external_data(tensor, path.name, offset, len(tensor.raw_data))
            tensor.ClearField("raw_data")
            tensor.data_location = TensorProto.EXTERNAL


@dataclass(frozen=True, slots=True)
class PackedRows:
    """Where each input of a padded batch lies in the packed rows: `row[i]`, from `start[i]`, `length[i]` tokens."""

    rows: int
    width: int
    row: npt.NDArray[np.int64]
    start: npt.NDArray[np.int64]
    length: npt.NDArray[np.int64]


def pack_rows(lengths: npt.NDArray[np.int64], most: int = PACKED_WIDTH) -> PackedRows:
    """First fit, longest first, into rows of `most` tokens (the longest input's length where that is more; the total
    where that is less, so that a lone input is one row of its own tokens)."""
    total, longest = int(lengths.sum()), int(lengths.max())
    width = max(longest, min(most, total))
    row, start = np.zeros(len(lengths), np.int64), np.zeros(len(lengths), np.int64)
    used: list[int] = []
    for i in np.argsort(-lengths, kind="stable"):
        n = int(lengths[i])
        place = next((r for r, filled in enumerate(used) if filled + n <= width), len(used))
        if place == len(used):
            used.append(0)
        row[i], start[i] = place, used[place]
        used[place] += n
    return PackedRows(len(used), width, row, start, lengths.astype(np.int64))


def packed_feed(
    packed: PackedRows, input_ids: npt.NDArray[np.int64], token_type_ids: npt.NDArray[np.int64] | None
) -> dict[str, npt.NDArray[np.int64] | npt.NDArray[np.int32]]:
    """The packed graph's inputs for a right-padded batch (`input_ids`: inputs x longest)."""
    shape = (packed.rows, packed.width)
    ids, types = np.zeros(shape, np.int64), np.zeros(shape, np.int64)
    positions = np.zeros(shape, np.int32)
    mask = np.zeros((packed.rows, packed.width, packed.width), np.int32)
    for i, (r, at, n) in enumerate(zip(packed.row, packed.start, packed.length, strict=True)):
        ids[r, at : at + n] = input_ids[i, :n]
        if token_type_ids is not None:
            types[r, at : at + n] = token_type_ids[i, :n]
        positions[r, at : at + n] = np.arange(n)
        mask[r, at : at + n, at : at + n] = 1
    return {
        "input_ids": ids,
        "token_type_ids": types,
        "attention_mask": np.ones(shape, np.int64),  # read by nothing now but the graph's own inputs
        POSITIONS: positions,
        BLOCK_MASK: mask,
    }


def unpacked(packed: PackedRows, hidden: npt.NDArray[np.float32], longest: int) -> npt.NDArray[np.float32]:
    """The packed rows' token states back as the padded batch's (inputs x longest x hidden, zeros at the padding)."""
    places = np.arange(longest)
    real = places[None, :] < packed.length[:, None]
    flat = (packed.row * packed.width + packed.start)[:, None] + np.where(real, places[None, :], 0)
    states: npt.NDArray[np.float32] = hidden.reshape(-1, hidden.shape[-1])[flat]
    states[~real] = 0.0
    return states
