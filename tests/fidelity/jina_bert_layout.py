"""jina-embeddings-v2's layout: a config of model_type `bert` (a type transformers knows) whose `auto_map` runs the
folder's own JinaBert code, which differs from transformers' BERT in ways that change every vector: no position
embeddings but ALiBi biases on the attention scores, and a gated feed-forward block (GEGLU). Served as transformers'
BertModel, or through poolserve's packed BERT, it would load most weights by name and answer plausible, wrong
vectors. Neither jinaai/jina-bert-implementation's files nor a port of them are in transformers or this repository,
so the folder's code here is a compact JinaBert written after that implementation's description (ALiBi slopes as in
"Train Short, Test Long", symmetric distances for an encoder; `gated_layers` → GELU gate times value → `wo` → residual
LayerNorm), standing in for the authors' `modeling_bert.py`: it holds the remote-code path for a known model_type
against SentenceTransformer(trust_remote_code=True) on the same code, not jina's code itself.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import torch

from bench.harness.models import TINY, bundled_model_folder
from tests.fidelity.legacy_st_files import write_legacy_st_files

CONFIGURATION = """
from transformers import PretrainedConfig


class JinaBertConfig(PretrainedConfig):
    model_type = "bert"

    def __init__(self, vocab_size=30528, hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                 intermediate_size=3072, hidden_act="gelu", hidden_dropout_prob=0.1,
                 attention_probs_dropout_prob=0.0, max_position_embeddings=8192, type_vocab_size=2,
                 initializer_range=0.02, layer_norm_eps=1e-12, pad_token_id=0, position_embedding_type="alibi",
                 feed_forward_type="geglu", **kwargs):
        super().__init__(pad_token_id=pad_token_id, **kwargs)
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.num_hidden_layers = num_hidden_layers
        self.num_attention_heads = num_attention_heads
        self.intermediate_size = intermediate_size
        self.hidden_act = hidden_act
        self.hidden_dropout_prob = hidden_dropout_prob
        self.attention_probs_dropout_prob = attention_probs_dropout_prob
        self.max_position_embeddings = max_position_embeddings
        self.type_vocab_size = type_vocab_size
        self.initializer_range = initializer_range
        self.layer_norm_eps = layer_norm_eps
        self.position_embedding_type = position_embedding_type
        self.feed_forward_type = feed_forward_type
"""

MODELING = """
import math

import torch
from torch import nn
from transformers import PreTrainedModel
from transformers.modeling_outputs import BaseModelOutput

from .configuration_bert import JinaBertConfig


def alibi_slopes(heads):
    def power_of_2(n):
        start = 2 ** (-(2 ** -(math.log2(n) - 3)))
        return [start * start**i for i in range(n)]

    if math.log2(heads).is_integer():
        return power_of_2(heads)
    closest = 2 ** math.floor(math.log2(heads))
    return power_of_2(closest) + alibi_slopes(2 * closest)[0::2][: heads - closest]


class JinaBertEmbeddings(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.word_embeddings = nn.Embedding(config.vocab_size, config.hidden_size, padding_idx=config.pad_token_id)
        self.token_type_embeddings = nn.Embedding(config.type_vocab_size, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(self, input_ids, token_type_ids):
        embeddings = self.word_embeddings(input_ids) + self.token_type_embeddings(token_type_ids)
        return self.dropout(self.LayerNorm(embeddings))


class JinaBertAttention(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.heads = config.num_attention_heads
        self.head_size = config.hidden_size // config.num_attention_heads
        self.query = nn.Linear(config.hidden_size, config.hidden_size)
        self.key = nn.Linear(config.hidden_size, config.hidden_size)
        self.value = nn.Linear(config.hidden_size, config.hidden_size)
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.attention_probs_dropout_prob)

    def split(self, states):
        batch, length, _ = states.shape
        return states.view(batch, length, self.heads, self.head_size).transpose(1, 2)

    def forward(self, hidden, bias):
        query, key, value = self.split(self.query(hidden)), self.split(self.key(hidden)), self.split(self.value(hidden))
        scores = query @ key.transpose(-1, -2) / math.sqrt(self.head_size) + bias
        context = self.dropout(scores.softmax(dim=-1)) @ value
        context = context.transpose(1, 2).reshape(hidden.shape)
        return self.LayerNorm(self.dense(context) + hidden)


class JinaBertGLUMLP(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.intermediate_size = config.intermediate_size
        self.gated_layers = nn.Linear(config.hidden_size, 2 * config.intermediate_size, bias=False)
        self.act = nn.GELU() if config.feed_forward_type == "geglu" else nn.ReLU()
        self.wo = nn.Linear(config.intermediate_size, config.hidden_size)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)
        self.layernorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)

    def forward(self, hidden):
        gated, non_gated = self.gated_layers(hidden).split(self.intermediate_size, dim=-1)
        return self.layernorm(self.wo(self.dropout(self.act(gated) * non_gated)) + hidden)


class JinaBertLayer(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.attention = JinaBertAttention(config)
        self.mlp = JinaBertGLUMLP(config)

    def forward(self, hidden, bias):
        return self.mlp(self.attention(hidden, bias))


class JinaBertModel(PreTrainedModel):
    config_class = JinaBertConfig
    base_model_prefix = "bert"

    def __init__(self, config):
        super().__init__(config)
        self.embeddings = JinaBertEmbeddings(config)
        self.layers = nn.ModuleList(JinaBertLayer(config) for _ in range(config.num_hidden_layers))
        # Computed at construction and kept out of the checkpoint, as jina's encoder keeps its `alibi` tensor.
        self.register_buffer("slopes", torch.tensor(alibi_slopes(config.num_attention_heads)), persistent=False)
        self.post_init()

    def _init_weights(self, module):
        if isinstance(module, (nn.Linear, nn.Embedding)):
            module.weight.data.normal_(mean=0.0, std=self.config.initializer_range)
        if isinstance(module, nn.Linear) and module.bias is not None:
            module.bias.data.zero_()

    def get_input_embeddings(self):
        return self.embeddings.word_embeddings

    def forward(self, input_ids=None, attention_mask=None, token_type_ids=None, **kwargs):
        batch, length = input_ids.shape
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        if token_type_ids is None:
            token_type_ids = torch.zeros_like(input_ids)
        hidden = self.embeddings(input_ids, token_type_ids)
        positions = torch.arange(length, device=input_ids.device)
        distance = (positions[None, :] - positions[:, None]).abs().to(hidden.dtype)
        alibi = -distance[None, :, :] * self.slopes.to(hidden.dtype)[:, None, None]
        padding = (1.0 - attention_mask[:, None, None, :].to(hidden.dtype)) * torch.finfo(hidden.dtype).min
        bias = alibi[None] + padding
        for layer in self.layers:
            hidden = layer(hidden, bias)
        return BaseModelOutput(last_hidden_state=hidden)
"""


def _stand_in(folder: Path) -> type:
    """The folder's model class, imported from its files as transformers' dynamic modules would."""
    package = f"jina_bert_stand_in_{abs(hash(folder))}"
    for name in ("configuration_bert", "modeling_bert"):
        spec = importlib.util.spec_from_file_location(f"{package}.{name}", folder / f"{name}.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[f"{package}.{name}"] = module
        spec.loader.exec_module(module)
    return sys.modules[f"{package}.modeling_bert"].JinaBertModel


def build_jina_bert_own_code(folder: Path) -> None:
    """A tiny random JinaBert in jina-embeddings-v2's layout, its code in the folder (auto_map without the
    repository prefix) and its weights under the code's own names."""
    from safetensors.torch import save_file
    from transformers import AutoTokenizer

    folder.mkdir(parents=True)
    (folder / "configuration_bert.py").write_text(CONFIGURATION)
    (folder / "modeling_bert.py").write_text(MODELING)
    model_class = _stand_in(folder)
    torch.manual_seed(26)
    config = model_class.config_class(vocab_size=30528, max_position_embeddings=128, **TINY)
    model = model_class(config).eval()
    save_file({name: tensor.contiguous() for name, tensor in model.state_dict().items()},
              str(folder / "model.safetensors"), metadata={"format": "pt"})  # fmt: skip
    config.architectures = ["JinaBertForMaskedLM"]
    config.save_pretrained(folder)
    path = folder / "config.json"
    saved = json.loads(path.read_text())
    saved["auto_map"] = {
        "AutoConfig": "configuration_bert.JinaBertConfig",
        "AutoModel": "modeling_bert.JinaBertModel",
    }
    path.write_text(json.dumps(saved, indent=2))
    AutoTokenizer.from_pretrained(bundled_model_folder()).save_pretrained(folder)
    write_legacy_st_files(folder, pooling="mean_tokens", max_seq_length=128, version="2.2.2")


def computed_buffers(model: torch.nn.Module) -> None:
    """The model's buffers as its code computes them when it builds it on a CPU, the way transformers 4 loaded such
    code (transformers 5 leaves them uninitialised): the reference the served model is held to."""
    built = type(model)(model.config)
    persistent = set(model.state_dict())
    for name, buffer in built.named_buffers():
        if name not in persistent:
            owner, _, leaf = name.rpartition(".")
            model.get_submodule(owner).register_buffer(leaf, buffer, persistent=False)
