"""A BERT encoder run on its inputs' real tokens: no compute spent on padding outside attention.

A padded batch of inputs of different lengths spends the linear layers' work (nearly all of an
encoder's compute at embedding lengths) on its padding too. Here every linear layer, layer norm
and embedding sees the batch's tokens packed end to end, [tokens, hidden]; only attention, which
must keep each input to its own tokens, runs on the padded grid [inputs, heads, longest, head size]
with the padding masked out, as the eager model does. The result is the eager model's last hidden
state, padded again (zeros at the padding) so that pooling and per-token outputs are unchanged.

Measured (bench/packed_trial.py; docs/benchmarks.md, "CPU engine"): batches of 8 to 32 corpus
sentences as they arrive run in 0.67-0.76 of the bundled MiniLM's padded time, lowest cosine to it
0.9999999. With padding no longer a cost, the scheduler fills each batch to its caps instead of
cutting windows by length (engine_core/scheduler.py).

Only `BertModel` itself (model_type "bert", absolute positions, an encoder) and
`BertForSequenceClassification` over one (cross-encoders) are run this way; other architectures keep
their own forward (`packable`).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from transformers import BertForSequenceClassification, BertModel


def packable(model: torch.nn.Module) -> bool:
    """Whether `model` is a BERT encoder this module reproduces exactly, or a BERT sequence classifier
    (a cross-encoder) over one."""
    if type(model) is BertForSequenceClassification:
        return model.bert.pooler is not None and packable(model.bert)
    config = getattr(model, "config", None)
    return (
        type(model) is BertModel
        and config is not None
        and config.model_type == "bert"
        and not config.is_decoder
        and getattr(config, "position_embedding_type", "absolute") == "absolute"
        and getattr(config, "chunk_size_feed_forward", 0) == 0
    )


def packed_last_hidden_state(
    model: Any, input_ids: torch.Tensor, mask: torch.Tensor, token_type_ids: torch.Tensor | None
) -> torch.Tensor:
    """The eager model's `last_hidden_state` for right-padded `input_ids` ([inputs, longest]; `mask`
    True at real tokens), with zeros at the padding. `model`: a BertModel that is `packable`."""
    count, width = input_ids.shape
    where = mask.reshape(-1).nonzero().squeeze(1)  # the real tokens' places in the padded grid
    ids = input_ids.reshape(-1)[where]
    positions = torch.arange(width, device=input_ids.device).expand(count, width).reshape(-1)[where]
    types = torch.zeros_like(ids) if token_type_ids is None else token_type_ids.reshape(-1)[where]
    embeddings = model.embeddings
    x = embeddings.word_embeddings(ids) + embeddings.token_type_embeddings(types)
    x = embeddings.LayerNorm(x + embeddings.position_embeddings(positions))
    hidden = x.shape[1]
    heads = model.config.num_attention_heads
    keys_mask = mask[:, None, None, :]

    def on_grid(states: torch.Tensor) -> torch.Tensor:
        """Packed [tokens, hidden] states back on the padded grid [inputs, longest, hidden], zeros at the padding."""
        grid = states.new_zeros(count * width, hidden)
        grid[where] = states
        return grid.view(count, width, hidden)

    def by_head(states: torch.Tensor) -> torch.Tensor:
        """Packed states on the grid attention runs on: [inputs, heads, longest, head size]."""
        return on_grid(states).view(count, width, heads, hidden // heads).transpose(1, 2)

    for layer in model.encoder.layer:
        attention = layer.attention.self
        context = F.scaled_dot_product_attention(
            by_head(attention.query(x)),
            by_head(attention.key(x)),
            by_head(attention.value(x)),
            attn_mask=keys_mask,
            scale=attention.scaling,
        )
        context = context.transpose(1, 2).reshape(count * width, hidden)[where]
        x = layer.attention.output.LayerNorm(layer.attention.output.dense(context) + x)
        x = layer.output.LayerNorm(layer.output.dense(layer.intermediate(x)) + x)
    return on_grid(x)


def packed_logits(
    model: Any,
    input_ids: torch.Tensor,
    mask: torch.Tensor,
    token_type_ids: torch.Tensor | None,
) -> torch.Tensor:
    """A packable BertForSequenceClassification's logits: its pooler (first token, dense, tanh), then its head."""
    hidden = packed_last_hidden_state(model.bert, input_ids, mask, token_type_ids)
    return model.classifier(model.bert.pooler(hidden))  # type: ignore[no-any-return]
