"""A folder's own model code: where auto_map takes it from, the weights it finds, the dtype it runs in."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from transformers import PretrainedConfig

from engine_core.folder_choices import LoadError
from engine_core.own_code import (
    check_weights_found,
    code_of_other_repositories,
    follow_dtype,
    restore_computed_buffers,
)


def test_auto_map_references_to_other_repositories_are_read_by_repository(tmp_path: Path) -> None:
    auto_map = {
        "AutoConfig": "jinaai/jina-bert-implementation--configuration_bert.JinaBertConfig",
        "AutoModel": "jinaai/jina-bert-implementation--modeling_bert.JinaBertModel",
        "AutoModelForMaskedLM": "modeling_local.Local",  # the folder's own file: not another repository's
        "AutoTokenizer": [None, "other/tokenizers--tokenization.FastTokenizer"],
    }
    (tmp_path / "config.json").write_text(json.dumps({"auto_map": auto_map}))
    assert code_of_other_repositories(tmp_path) == {
        "jinaai/jina-bert-implementation": {
            "AutoConfig": "configuration_bert.JinaBertConfig",
            "AutoModel": "modeling_bert.JinaBertModel",
        },
        "other/tokenizers": {"AutoTokenizer": "tokenization.FastTokenizer"},
    }


def test_a_folder_without_a_readable_auto_map_takes_no_code_from_elsewhere(tmp_path: Path) -> None:
    assert code_of_other_repositories(tmp_path) == {}
    (tmp_path / "config.json").write_text("[1, 2]")
    assert code_of_other_repositories(tmp_path) == {}


def test_weights_missing_under_own_code_are_refused_except_a_poolers() -> None:
    config = PretrainedConfig(auto_map={"AutoModel": "modeling.NewModel"})
    check_weights_found(config, "AutoModel", ["pooler.dense.weight", "new.pooler.dense.bias"])
    with pytest.raises(LoadError, match=r"for 1 of its parameters \(encoder.layer.0.weight\)"):
        check_weights_found(config, "AutoModel", ["pooler.dense.weight", "encoder.layer.0.weight"])
    # transformers' own classes report what they report; only the folder's code is held to it here
    check_weights_found(PretrainedConfig(), "AutoModel", ["encoder.layer.0.weight"])


def test_a_model_left_in_float32_by_its_own_loading_follows_the_dtype_asked_for() -> None:
    model = torch.nn.Sequential(torch.nn.Embedding(4, 2), torch.nn.Linear(2, 2))
    assert {p.dtype for p in follow_dtype(model, torch.bfloat16).parameters()} == {torch.bfloat16}


def test_a_model_loaded_in_the_dtype_keeps_the_weights_it_keeps_in_float32() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(2, 2).to(torch.bfloat16), torch.nn.LayerNorm(2))
    follow_dtype(model, torch.bfloat16)
    assert [p.dtype for p in model.parameters()] == [torch.bfloat16] * 2 + [torch.float32] * 2


class Frequencies(torch.nn.Module):
    """Own code in transformers 4's manner: a buffer computed at construction, kept out of the checkpoint."""

    def __init__(self, config: PretrainedConfig, extra: int | None = None) -> None:
        super().__init__()
        if extra is None and getattr(config, "needs_extra", False):
            raise TypeError("__init__() missing 1 required argument: 'extra'")
        self.config = config
        self.linear = torch.nn.Linear(4, 4)
        self.register_buffer("inv_freq", 1.0 / 10000 ** (torch.arange(0, 4, 2) / 4), persistent=False)
        self.register_buffer("kept", torch.ones(2))


def own(config: PretrainedConfig) -> PretrainedConfig:
    config.auto_map = {"AutoModel": "modeling.Frequencies"}
    return config


def test_a_buffer_own_code_computes_at_construction_is_restored_when_loading_left_it_uninitialised() -> None:
    model = Frequencies(own(PretrainedConfig()))
    expected = model.inv_freq.clone()
    model.inv_freq.copy_(torch.tensor([3.0e-38, 1.0e15]))  # what uninitialised memory holds
    model.kept.fill_(5.0)  # a checkpoint's buffer is the checkpoint's
    assert restore_computed_buffers(model, "AutoModel") == ["inv_freq"]
    assert torch.equal(model.inv_freq, expected)
    assert torch.equal(model.kept, torch.full((2,), 5.0))
    assert restore_computed_buffers(model, "AutoModel") == []  # nothing differs any more


def test_buffers_are_left_to_transformers_own_classes() -> None:
    model = Frequencies(PretrainedConfig())  # no auto_map: transformers' class, whose _init_weights sets them
    model.inv_freq.fill_(7.0)
    assert restore_computed_buffers(model, "AutoModel") == []
    assert torch.equal(model.inv_freq, torch.full((2,), 7.0))


def test_own_code_that_cannot_be_built_again_to_compute_its_buffers_is_refused() -> None:
    config = own(PretrainedConfig())
    model = Frequencies(config, extra=1)
    config.needs_extra = True
    with pytest.raises(LoadError, match=r"computes buffers when it builds the model \(inv_freq\).*TypeError"):
        restore_computed_buffers(model, "AutoModel")
