"""Encoders run on their inputs' real tokens: no compute spent on padding outside attention.

A padded batch of inputs of different lengths spends the linear layers' work (nearly all of an
encoder's compute at embedding lengths) on its padding too. Here every linear layer, layer norm
and embedding sees the batch's tokens packed end to end, [tokens, hidden]; only attention, which
must keep each input to its own tokens, runs on the padded grid [inputs, heads, longest, head size]
with the padding masked out, as the eager model does (for BERT-family encoders on a CPU, on a few grids of
inputs of like lengths: `length_groups`). Positions are each input's own, computed as
the model computes them on the padded batch: BERT's from 0, RoBERTa's and MPNet's from the padding
id + 1, MPNet's relative attention bias and ModernBERT's rotary angles and local window on the grid's
places, which are each input's own. The result is the eager model's last hidden state, padded again
(zeros at the padding) so that pooling and per-token outputs are unchanged.

Measured (bench/packed_trial.py; docs/benchmarks.md, "CPU engine"): batches of 8 to 32 corpus
sentences as they arrive run in 0.67-0.76 of the bundled MiniLM's padded time, lowest cosine to it
0.9999999; XLM-RoBERTa, MPNet and ModernBERT of MiniLM's width alike, 0.69-0.78 ("Token packing beyond BERT").
With padding no longer a cost, the scheduler fills each batch to its caps instead of cutting windows
by length (engine_core/scheduler.py).

Run this way (`packable`): `BertModel`, `RobertaModel`, `XLMRobertaModel`, `MPNetModel` and
`ModernBertModel` as encoders with their usual options, and the sequence classifiers (cross-encoders)
over them; other architectures keep their own forward.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from transformers import (
    BertForSequenceClassification,
    BertModel,
    ModernBertForSequenceClassification,
    ModernBertModel,
    MPNetForSequenceClassification,
    MPNetModel,
    RobertaForSequenceClassification,
    RobertaModel,
    XLMRobertaForSequenceClassification,
    XLMRobertaModel,
)
from transformers.models.modernbert.modeling_modernbert import apply_rotary_pos_emb
from transformers.models.mpnet.modeling_mpnet import create_position_ids_from_input_ids

ROBERTAS = (RobertaModel, XLMRobertaModel)
# The model type each BERT-layered encoder's config must say (a config of another type would mean other embeddings).
BERT_LAYERED: dict[type[torch.nn.Module], str] = {
    BertModel: "bert",
    RobertaModel: "roberta",
    XLMRobertaModel: "xlm-roberta",
}
ROBERTA_CLASSIFIERS = (RobertaForSequenceClassification, XLMRobertaForSequenceClassification)
MODERNBERT_LAYERS = {"full_attention", "sliding_attention"}
# A layer's query, key and value states: three products, or one product's side by side ([tokens, 3 x hidden]).
Projections = torch.Tensor | tuple[torch.Tensor, torch.Tensor, torch.Tensor]
# Where join_projections puts the one linear layer that replaces an attention module's three.
JOINED = "joined_projections"


def packable(model: torch.nn.Module) -> bool:
    """Whether `model` is an encoder this module reproduces exactly, or a sequence classifier (a cross-encoder)
    over one."""
    kind = type(model)
    head: Any = model  # what a classifier holds, read by its class's attribute names
    if kind is BertForSequenceClassification:
        return head.bert.pooler is not None and packable(head.bert)
    if kind in ROBERTA_CLASSIFIERS:
        return packable(head.roberta)
    if kind is MPNetForSequenceClassification:
        return packable(head.mpnet)
    if kind is ModernBertForSequenceClassification:
        return head.config.classifier_pooling in ("cls", "mean") and packable(head.model)
    config: Any = getattr(model, "config", None)
    if config is None:
        return False
    if kind in BERT_LAYERED:
        return (
            config.model_type == BERT_LAYERED[kind]
            and not config.is_decoder
            and getattr(config, "position_embedding_type", "absolute") == "absolute"
            and getattr(config, "chunk_size_feed_forward", 0) == 0
        )
    if kind is MPNetModel:
        return config.model_type == "mpnet"  # type: ignore[no-any-return]
    if kind is ModernBertModel:
        return config.model_type == "modernbert" and set(config.layer_types) <= MODERNBERT_LAYERS
    return False


class Grid:
    """A right-padded batch's real tokens, packed end to end, and the way to and from the padded grid
    [inputs, longest] that attention runs on. A batch without padding (one input, or inputs of one length) is its
    own grid: no copies to and fro, and no mask (`keys` None) for attention within each input."""

    def __init__(self, mask: torch.Tensor, hidden: int, heads: int):
        self.mask = mask
        self.count, self.width = mask.shape
        self.where = mask.reshape(-1).nonzero().squeeze(1)  # the real tokens' places in the padded grid
        self.is_full = len(self.where) == self.count * self.width
        # each input attends to its own real tokens
        self.keys: torch.Tensor | None = None if self.is_full else mask[:, None, None, :]
        self.hidden, self.heads = hidden, heads
        self._groups: list[tuple[torch.Tensor, Grid]] | None = None

    def take(self, grid: torch.Tensor) -> torch.Tensor:
        """The real tokens' values of a [inputs, longest, ...] grid, packed: [tokens, ...]."""
        flat = grid.reshape(self.count * self.width, *grid.shape[2:])
        # index_select copies whole rows: 87 against 486 µs for indexing (`flat[self.where]`), which computes each
        # element's place, for 1,500 of 2,160 rows of 12 x 32 (one thread)
        return flat if self.is_full else flat.index_select(0, self.where)

    def on_grid(self, states: torch.Tensor) -> torch.Tensor:
        """Packed [tokens, ...] states back on the padded grid [inputs, longest, ...], zeros at the padding."""
        if self.is_full:
            return states.reshape(self.count, self.width, *states.shape[1:])
        grid = states.new_zeros(self.count * self.width, *states.shape[1:])
        grid[self.where] = states
        return grid.view(self.count, self.width, *states.shape[1:])

    def by_head(self, states: torch.Tensor) -> torch.Tensor:
        """Packed states ([tokens, hidden] or [tokens, heads, head size]) on the grid attention runs on:
        [inputs, heads, longest, head size]."""
        grid = self.on_grid(states.reshape(len(states), self.heads, -1))
        return grid.transpose(1, 2)

    def attend(
        self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor | None, scale: float
    ) -> torch.Tensor:
        """Attention of packed query, key and value states within each input (`mask`: boolean, or a float bias
        with -inf at the padding; None: every place of the grid), packed again: [tokens, hidden]."""
        context = F.scaled_dot_product_attention(
            self.by_head(query), self.by_head(key), self.by_head(value), attn_mask=mask, scale=scale
        )
        return self.take(context.transpose(1, 2)).reshape(len(self.where), self.hidden)

    def attend_projections(self, projections: Projections, mask: torch.Tensor | None, scale: float) -> torch.Tensor:
        """`attend` of a layer's packed query, key and value states: three tensors, or one product's side by side,
        [tokens, 3 x hidden] (`join_projections`'s layer), put on the grid by one copy for the three instead of one
        each, and then attended by `attention` (as batched products in float32 on a CPU)."""
        if isinstance(projections, tuple):
            return self.attend(*projections, mask, scale)
        grid = self.on_grid(projections.view(len(projections), 3, self.heads, -1))
        query, key, value = grid.permute(2, 0, 3, 1, 4).unbind(0)  # each [inputs, heads, longest, head size]
        context = attention(query, key, value, mask, scale)
        return self.take(context.transpose(1, 2)).reshape(len(self.where), self.hidden)

    def attend_own(self, projections: Projections, scale: float) -> torch.Tensor:
        """`attend_projections` with no mask but each input's own tokens, on grids of inputs of like lengths
        (`length_groups`): attention's work grows with the square of the grid's width, and on one grid every input
        pays the longest's."""
        if self._groups is None:
            groups = length_groups(self)
            # One run is this grid itself: kept as none rather than as a reference to itself, a cycle that would
            # leave each pass's grid and its tensors to the cyclic collector.
            self._groups = groups if len(groups) > 1 else []
        if not self._groups:
            return self.attend_projections(projections, self.keys, scale)
        first = projections[0] if isinstance(projections, tuple) else projections
        out = first.new_empty(len(first), self.hidden)
        for rows, grid in self._groups:
            if isinstance(projections, tuple):
                query, key, value = (states.index_select(0, rows) for states in projections)
                part: Projections = (query, key, value)
            else:
                part = projections.index_select(0, rows)
            out.index_copy_(0, rows, grid.attend_projections(part, grid.keys, scale))
        return out


# How many (query, key) scores `attention` computes at once, over as many inputs' heads as fit: ~1 MB of float32,
# within a core's L2 cache; past it a grid of MiniLM's heads, 16 inputs x 40 places, took 2.6 x as long. And the
# widest grid it takes: at 256 places and more torch's kernel, which works through the keys in blocks, took a third of
# the time (at 128 and less, 0.7-0.9 of the kernel's).
SCORES_AT_ONCE = 1 << 18
WIDEST_PRODUCTS = 128


def attention(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor | None, scale: float
) -> torch.Tensor:
    """softmax(query keyᵀ x scale + mask) value for each input and head, [inputs, heads, longest, head size]; `mask`
    boolean (False: left out) or a float bias, broadcast over the scores. In float32 on a CPU as batched products of
    a few inputs' heads at once: torch's fused kernel, once the engine has set its thread count (engine_core/
    threads.py, whose torch.set_num_threads has MKL thread its products inside the kernel's own parallel loop), took
    up to 2.6 x as long on grids of MiniLM's heads (4-32 inputs), and a pass of 16-32 sentences on two threads ran
    1.06-1.07 x the sentences a second this way (level at one or two sentences, and on one thread;
    docs/benchmarks.md, "Attention as products"). It rounds alike (within 1e-6). Elsewhere torch's kernel: in
    bfloat16 it was 8-11 % faster, and on grids wider than WIDEST_PRODUCTS."""
    count, heads, width, size = query.shape
    if query.device.type != "cpu" or query.dtype != torch.float32 or width > WIDEST_PRODUCTS:
        return F.scaled_dot_product_attention(query, key, value, attn_mask=mask, scale=scale)
    bias = None  # [inputs or 1, heads or 1, longest or 1, longest]
    if mask is not None:
        bias = mask.float() if mask.dtype != torch.bool else torch.zeros(mask.shape).masked_fill_(~mask, -math.inf)
        bias = bias.reshape(*(1,) * (4 - bias.dim()), *bias.shape)
    out = query.new_empty(count, heads, width, size)
    step = max(1, SCORES_AT_ONCE // (heads * width * width))
    for start in range(0, count, step):
        end = min(count, start + step)
        rows = (end - start) * heads
        scores = torch.baddbmm(
            query.new_empty(rows, width, width), query[start:end].reshape(rows, width, size),
            key[start:end].reshape(rows, width, size).transpose(1, 2), beta=0, alpha=scale,
        )  # fmt: skip
        if bias is not None:
            scores.view(end - start, heads, width, width).add_(bias if len(bias) == 1 else bias[start:end])
        torch.bmm(
            scores.softmax(-1), value[start:end].reshape(rows, width, size), out=out[start:end].view(rows, width, size)
        )
    return out


# A grid of its own costs a few more calls a layer (the gathers, the scatter back, attention's own set-up): about
# what attention over this many (query, key) places costs, measured on MiniLM's heads on a 2-core CPU.
GROUP_COST = 4096
MOST_GROUPS = 4


def length_groups(grid: Grid) -> list[tuple[torch.Tensor, Grid]]:
    """The grid's inputs split, shortest first, into up to MOST_GROUPS runs of equal count where that lowers
    attention's work (inputs x width^2 summed over the grids, plus GROUP_COST a grid): each run's packed token rows
    and its own grid, as wide as its longest input. One run (the grid itself) on a GPU, where reading the lengths
    would wait for the device, and where the batch has no padding."""
    if grid.is_full or grid.mask.device.type != "cpu":
        return [(grid.where, grid)]
    lengths = grid.mask.sum(dim=1).numpy()
    order = np.argsort(lengths, kind="stable")
    ends = np.cumsum(lengths)
    best_cost, best_cuts = grid.count * grid.width**2, [grid.count]
    for groups in range(2, min(MOST_GROUPS, grid.count) + 1):
        cuts = [round(grid.count * (g + 1) / groups) for g in range(groups)]
        starts = [0, *cuts[:-1]]
        cost = sum((end - start) * int(lengths[order[end - 1]]) ** 2 for start, end in zip(starts, cuts, strict=True))
        if cost + GROUP_COST * (groups - 1) < best_cost:
            best_cost, best_cuts = cost + GROUP_COST * (groups - 1), cuts
    if len(best_cuts) == 1:
        return [(grid.where, grid)]
    runs = []
    for start, end in zip([0, *best_cuts[:-1]], best_cuts, strict=True):
        members = np.sort(order[start:end])  # in batch order: their token rows ascend
        rows = np.concatenate([np.arange(ends[i] - lengths[i], ends[i]) for i in members])
        width = int(lengths[members].max())
        own = Grid(grid.mask[torch.from_numpy(members)][:, :width], grid.hidden, grid.heads)
        runs.append((torch.from_numpy(rows), own))
    return runs


def packed_last_hidden_state(
    model: Any, input_ids: torch.Tensor, mask: torch.Tensor, token_type_ids: torch.Tensor | None
) -> torch.Tensor:
    """The eager model's `last_hidden_state` for right-padded `input_ids` ([inputs, longest]; `mask`
    True at real tokens), with zeros at the padding. `model`: an encoder that is `packable`."""
    config = model.config
    grid = Grid(mask, config.hidden_size, config.num_attention_heads)
    if isinstance(model, MPNetModel):
        return grid.on_grid(run_mpnet(model, grid, input_ids))
    if isinstance(model, ModernBertModel):
        return grid.on_grid(run_modernbert(model, grid, input_ids))
    if isinstance(model, ROBERTAS):
        embeddings = model.embeddings
        positions = embeddings.create_position_ids_from_input_ids(input_ids, embeddings.padding_idx)  # type: ignore[no-untyped-call]
    else:
        positions = torch.arange(grid.width, device=input_ids.device).expand(grid.count, grid.width)
    return grid.on_grid(run_bert(model, grid, input_ids, grid.take(positions), token_type_ids))


def projections_of(attention: torch.nn.Module, x: torch.Tensor, names: tuple[str, str, str]) -> Projections:
    """An attention module's query, key and value states of `x`: from its joined layer (`join_projections`), else
    from its layers of those `names`."""
    one = getattr(attention, JOINED, None)
    if one is not None:
        return one(x)  # type: ignore[no-any-return]
    query, key, value = (getattr(attention, name)(x) for name in names)
    return query, key, value


def attention_projections(model: torch.nn.Module) -> list[tuple[torch.nn.Module, tuple[str, str, str]]]:
    """The attention modules whose query, key and value run_bert and run_mpnet read, with those layers' names:
    every layer's of each packable BERT-layered or MPNet encoder in `model` (itself, or a classifier's)."""
    found: list[tuple[torch.nn.Module, tuple[str, str, str]]] = []
    for module in model.modules():
        encoder: Any = module  # read by its class's attribute names
        if type(module) in BERT_LAYERED and packable(module):
            found += [(layer.attention.self, ("query", "key", "value")) for layer in encoder.encoder.layer]
        elif type(module) is MPNetModel and packable(module):
            found += [(layer.attention.attn, ("q", "k", "v")) for layer in encoder.encoder.layer]
    return found


# An attention module join_projections changed: the module, its three layers' names and the layers.
Joined = tuple[torch.nn.Module, tuple[str, str, str], list[torch.nn.Linear]]


def join_projections(model: torch.nn.Module) -> list[Joined]:
    """In place, each attention module's query, key and value layers (plain linear layers of one shape, dtype and
    device, all with a bias or none) replaced by one linear layer of their weights side by side (JOINED), which
    the packed encoder runs instead: one product a layer instead of three, one copy onto attention's grid, and
    attention itself as batched products in float32 on a CPU (`attention`; each rounds within float32's last bits
    of the separate layers and torch's kernel, which a sparse model's zeros are not held to: the loader joins
    neither SPLADE nor bge-m3). The separate layers leave the module: only the packed encoder runs it after this (its
    own forward cannot). What was replaced, for `unjoin_projections`."""
    replaced = []
    for attention, names in attention_projections(model):
        layers = [getattr(attention, name, None) for name in names]
        if not all(type(layer) is torch.nn.Linear for layer in layers):
            continue
        linears: list[torch.nn.Linear] = layers  # type: ignore[assignment]
        first = linears[0]
        weight, bias = first.weight, first.bias
        if any(
            layer.weight.shape != weight.shape
            or layer.weight.dtype != weight.dtype
            or layer.weight.device != weight.device
            or (layer.bias is None) != (bias is None)
            for layer in linears
        ):
            continue
        one = torch.nn.Linear(
            first.in_features, sum(layer.out_features for layer in linears), bias=bias is not None,
            device="meta",
        )  # fmt: skip
        one.weight = torch.nn.Parameter(torch.cat([layer.weight.detach() for layer in linears]), requires_grad=False)
        if bias is not None:
            one.bias = torch.nn.Parameter(torch.cat([layer.bias.detach() for layer in linears]), requires_grad=False)
        for name in names:
            delattr(attention, name)
        setattr(attention, JOINED, one)
        replaced.append((attention, names, linears))
    return replaced


def unjoin_projections(replaced: list[Joined]) -> None:
    """Undo `join_projections`: each module's own three layers back, its joined one gone."""
    for attention, names, linears in replaced:
        delattr(attention, JOINED)
        for name, linear in zip(names, linears, strict=True):
            setattr(attention, name, linear)


def run_bert(
    model: Any, grid: Grid, input_ids: torch.Tensor, positions: torch.Tensor, token_type_ids: torch.Tensor | None
) -> torch.Tensor:
    """BERT's and RoBERTa's encoder (the same layers; their positions differ) on the packed tokens."""
    ids = grid.take(input_ids)
    types = torch.zeros_like(ids) if token_type_ids is None else grid.take(token_type_ids)
    embeddings = model.embeddings
    x: torch.Tensor = embeddings.word_embeddings(ids) + embeddings.token_type_embeddings(types)
    x = embeddings.LayerNorm(x + embeddings.position_embeddings(positions))
    for layer in model.encoder.layer:
        attention = layer.attention.self
        context = grid.attend_own(projections_of(attention, x, ("query", "key", "value")), attention.scaling)
        # the modules' own forwards (LayerNorm of dense + input; dropout is nothing in eval), which
        # engine_core/fused_layers.py may have fused
        x = layer.attention.output(context, x)
        x = layer.output(layer.intermediate(x), x)
    return x


def run_mpnet(model: Any, grid: Grid, input_ids: torch.Tensor) -> torch.Tensor:
    """MPNet's encoder on the packed tokens: its relative position bias is the grid's, the same for every input
    (a place's distance to another is the same in the input and on the right-padded grid)."""
    embeddings = model.embeddings
    positions = grid.take(create_position_ids_from_input_ids(input_ids, embeddings.padding_idx))  # type: ignore[no-untyped-call]
    x: torch.Tensor = embeddings.LayerNorm(
        embeddings.word_embeddings(grid.take(input_ids)) + embeddings.position_embeddings(positions)
    )
    shape = x.new_empty(1, grid.width, 1)  # compute_position_bias reads the batch and length off its input
    bias = model.encoder.compute_position_bias(shape).expand(grid.count, -1, -1, -1)
    mask = bias if grid.keys is None else bias.masked_fill(~grid.keys, float("-inf"))
    for layer in model.encoder.layer:
        attention = layer.attention.attn
        scale = attention.attention_head_size**-0.5
        context = grid.attend_projections(projections_of(attention, x, ("q", "k", "v")), mask, scale)
        x = layer.attention.LayerNorm(attention.o(context) + x)
        x = layer.output(layer.intermediate(x), x)
    return x


def run_modernbert(model: Any, grid: Grid, input_ids: torch.Tensor) -> torch.Tensor:
    """ModernBERT's encoder on the packed tokens: rotary angles of each token's place in its input, and the
    local layers' window (places at most `sliding_window` apart) on the grid."""
    config = model.config
    x = model.embeddings.norm(model.embeddings.tok_embeddings(grid.take(input_ids)))
    places = torch.arange(grid.width, device=input_ids.device)
    within = (places[None, :] - places[:, None]).abs() <= config.sliding_window
    masks = {"full_attention": grid.keys, "sliding_attention": within if grid.keys is None else grid.keys & within}
    angles = {}
    for layer_type in set(config.layer_types):
        cos, sin = model.rotary_emb(x, places[None, :], layer_type)
        angles[layer_type] = grid.take(cos.expand(grid.count, -1, -1)), grid.take(sin.expand(grid.count, -1, -1))
    heads = config.num_attention_heads
    for layer in model.layers:
        attention = layer.attn
        query, key, value = attention.Wqkv(layer.attn_norm(x)).view(len(x), 3, heads, -1).unbind(dim=1)
        query, key = apply_rotary_pos_emb(query, key, *angles[layer.attention_type], unsqueeze_dim=1)
        context = grid.attend(query, key, value, masks[layer.attention_type], attention.head_dim**-0.5)
        x = x + attention.Wo(context)
        x = x + layer.mlp(layer.mlp_norm(x))
    return model.final_norm(x)  # type: ignore[no-any-return]


def packed_logits(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    mask: torch.Tensor,
    token_type_ids: torch.Tensor | None,
) -> torch.Tensor:
    """A packable sequence classifier's logits: its encoder on the real tokens, then its own head as its forward
    applies it (BERT: the pooler, first token, dense, tanh, then the classifier; RoBERTa, MPNet: the classifier
    reads the first token; ModernBERT: its first token or mean, then its head and classifier)."""
    head: Any = model  # read by its class's attribute names
    logits: torch.Tensor
    if isinstance(model, BertForSequenceClassification):
        logits = head.classifier(head.bert.pooler(packed_last_hidden_state(head.bert, input_ids, mask, token_type_ids)))
    elif isinstance(model, ROBERTA_CLASSIFIERS):
        logits = head.classifier(packed_last_hidden_state(head.roberta, input_ids, mask, token_type_ids))
    elif isinstance(model, MPNetForSequenceClassification):
        logits = head.classifier(packed_last_hidden_state(head.mpnet, input_ids, mask, token_type_ids))
    else:
        hidden = packed_last_hidden_state(head.model, input_ids, mask, token_type_ids)
        if head.config.classifier_pooling == "cls":
            pooled = hidden[:, 0]
        else:  # the padding's states are zeros: the sum over the grid is the sum over the real tokens
            pooled = hidden.sum(dim=1) / mask.sum(dim=1, keepdim=True)
        logits = head.classifier(head.head(pooled))
    return logits
