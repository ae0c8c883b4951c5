"""engine_core/fused_layers.py: a BERT-family layer's GELU and residual adds done inside its packed linear layers
answer as the eager layer does, on the padded forward and on token packing's; a layer whose code or activation
differs is left alone; fusing is undone where the answers move."""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import pytest
import torch
from transformers import BertConfig, BertModel, MPNetConfig, MPNetModel, RobertaConfig, RobertaModel
from transformers.models.bert.modeling_bert import BertOutput

from bench.harness.models import TINY
from engine_core.fused_layers import fuse_layers, fuse_layers_checked
from engine_core.packed_encoder import packed_last_hidden_state
from engine_core.packed_linear import PackedLinear, pack_linears
from engine_core.runner import TextBatch
from tests.engine_core.cpu_support import BF16_PACKS

CPU = torch.device("cpu")
ROBERTA_SIZES = {"vocab_size": 30522, "max_position_embeddings": 130, "pad_token_id": 1, **TINY}
ENCODERS = {
    "bert": (lambda **extra: BertModel(BertConfig(vocab_size=30522, max_position_embeddings=128, **TINY, **extra)), 0),
    "roberta": (lambda **extra: RobertaModel(RobertaConfig(**ROBERTA_SIZES, **extra)), 1),
    "mpnet": (lambda **extra: MPNetModel(MPNetConfig(**ROBERTA_SIZES, **extra)), 1),
}


def rows_of(lengths: list[int], pad: int) -> list[np.ndarray]:
    rng = np.random.default_rng(3)
    return [np.concatenate([[101], rng.integers(1000, 29000, n - 2), [102]]).astype(np.int32) for n in lengths]


def states_of(model: torch.nn.Module, pad: int, packed: bool) -> torch.Tensor:
    """Token states of a batch of unequal lengths, through the model's own padded forward or token packing's."""
    batch = TextBatch(rows_of([12, 3, 30, 7], pad), None, pad, CPU)
    with torch.inference_mode():
        if packed:
            return packed_last_hidden_state(model, batch.input_ids, batch.mask, None)
        states: torch.Tensor = model(input_ids=batch.input_ids, attention_mask=batch.mask).last_hidden_state
        return states * batch.mask[..., None]


def packed_model(architecture: str, **extra: object) -> tuple[Any, int]:
    build, pad = ENCODERS[architecture]
    torch.manual_seed(5)
    model = build(**extra).eval()
    assert pack_linears(model, lambda: np.zeros((1, 1), dtype=np.float32), np.zeros((1, 1), dtype=np.float32)) > 0
    return model, pad


@pytest.mark.parametrize("architecture", list(ENCODERS))
@pytest.mark.parametrize("packed", [False, True], ids=["padded", "token-packing"])
def test_a_fused_model_answers_as_the_eager_one(architecture: str, packed: bool) -> None:
    model, pad = packed_model(architecture)
    before = states_of(model, pad, packed)
    undo = fuse_layers(model)
    layers = model.config.num_hidden_layers
    # each layer: its GELU, and its output's add; BERT's and RoBERTa's attention output is BERT's output code too
    assert len(undo) == (3 if architecture != "mpnet" else 2) * layers
    assert model.encoder.layer[0].intermediate.dense.post == "gelu"
    assert type(model.encoder.layer[0].intermediate.intermediate_act_fn) is torch.nn.Identity
    torch.testing.assert_close(states_of(model, pad, packed), before, atol=1e-5, rtol=0)
    for step in undo:
        step()
    assert model.encoder.layer[0].intermediate.dense.post == "none"
    assert "forward" not in vars(model.encoder.layer[0].output)
    torch.testing.assert_close(states_of(model, pad, packed), before, atol=1e-5, rtol=0)


def test_another_activation_or_another_forward_is_left_alone() -> None:
    model, pad = packed_model("bert", hidden_act="gelu_new")  # the tanh GELU: not the erf one oneDNN's post-op is
    before = states_of(model, pad, False)
    assert len(fuse_layers(model)) == 2 * model.config.num_hidden_layers  # the adds only
    assert model.encoder.layer[0].intermediate.dense.post == "none"
    torch.testing.assert_close(states_of(model, pad, False), before, atol=1e-5, rtol=0)

    class ScaledOutput(BertOutput):  # its own code: the sum is not BERT's
        def forward(self, hidden_states: torch.Tensor, input_tensor: torch.Tensor) -> torch.Tensor:
            return self.LayerNorm(self.dense(hidden_states) * 0.5 + input_tensor)  # type: ignore[no-any-return]

    model, _ = packed_model("bert")
    for layer in model.encoder.layer:
        scaled = ScaledOutput(model.config)
        scaled.load_state_dict(layer.output.state_dict(), strict=False)
        scaled.dense = layer.output.dense
        layer.output = scaled.eval()
    fuse_layers(model)
    assert all("forward" not in vars(layer.output) for layer in model.encoder.layer)
    assert all("forward" in vars(layer.attention.output) for layer in model.encoder.layer)


def test_nothing_is_fused_on_plain_linear_layers_or_in_bfloat16() -> None:
    build, _ = ENCODERS["bert"]
    model = build().eval()
    assert fuse_layers(model) == []
    assert not any(isinstance(module, PackedLinear) for module in model.modules())
    model = build().eval().to(torch.bfloat16)
    packed = pack_linears(model, lambda: np.zeros((1, 1), dtype=np.float32), np.zeros((1, 1), dtype=np.float32))
    assert packed > 0 if BF16_PACKS else packed == 0  # a CPU without AVX512 packs no bfloat16 weight
    assert fuse_layers(model) == []


def test_fusing_is_undone_where_the_answers_move(caplog: pytest.LogCaptureFixture) -> None:
    model, pad = packed_model("bert")

    def answers() -> np.ndarray:
        return states_of(model, pad, False).numpy().reshape(4, -1)

    before = answers()
    with caplog.at_level(logging.WARNING, logger="engine_core.fused_layers"):
        assert fuse_layers_checked(model, answers, -before) == 0
    assert "left unfused: its vectors moved" in caplog.text
    assert model.encoder.layer[0].intermediate.dense.post == "none"
    assert "forward" not in vars(model.encoder.layer[0].output)
    assert fuse_layers_checked(model, answers, before) == 3 * model.config.num_hidden_layers
