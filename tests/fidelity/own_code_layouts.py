"""Folders whose config.json runs their own model code (`auto_map`, --trust-remote-code), in NomicBert's and
GTE-new's layouts.

nomic-embed-text ships a config of model_type `nomic_bert` whose auto_map takes its code from another repository
(`nomic-ai/nomic-bert-2048--modeling_hf_nomic_bert.NomicBertModel`), Sentence-Transformers files in the 2.x layout
(Transformer, mean Pooling, Normalize) and `search_query: `/`search_document: ` prompts; gte-base-en-v1.5 and
gte-multilingual-base a config of model_type `new` (a type transformers does not know) whose code comes from
`Alibaba-NLP/new-impl` (`configuration.NewConfig`, `modeling.NewModel`), pooled from the CLS token. The code in a
served folder here is transformers' own port of the architecture (NomicBert, GTE), named as the folder's files:
nomic's and Alibaba's files are not vendored into this repository, so these layouts hold the remote-code path
(auto_map, the dynamic module, prompts, pooling) against SentenceTransformer(trust_remote_code=True) on the same
code, not those authors' code itself.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

from bench.harness.models import TINY, bundled_model_folder
from tests.fidelity.legacy_st_files import write_legacy_st_files

NOMIC_PROMPTS = {
    "query": "search_query: ",
    "document": "search_document: ",
    "classification": "classification: ",
    "clustering": "clustering: ",
}


@dataclass(frozen=True)
class Family:
    repository: str  # where the family's folders take their code from (auto_map's "repository--" prefix)
    model_type: str
    config_module: str
    config_class: str
    model_module: str
    model_class: str
    port: str  # transformers' own port, the stand-in: its module under transformers.models, and class names
    port_config: str
    port_model: str
    pooling: str
    prompts: dict[str, str]
    model_extra: str = ""  # what the family's own model class does beyond transformers' port
    # Whether the folder brings a config class of its own (gte-Qwen2's config is transformers' own qwen2).
    own_config: bool = True
    config_changes: dict[str, Any] = field(default_factory=dict)  # beyond TINY, where the config's defaults are big

    def auto_map(self, elsewhere: bool) -> dict[str, str]:
        prefix = f"{self.repository}--" if elsewhere else ""
        model = {"AutoModel": f"{prefix}{self.model_module}.{self.model_class}"}
        return (
            {"AutoConfig": f"{prefix}{self.config_module}.{self.config_class}", **model} if self.own_config else model
        )

    def stand_in_code(self) -> dict[str, str]:
        """Subclasses of transformers' port, so that transformers registering the folder's classes for its Auto
        classes leaves its own built-in ones untouched."""
        config = (
            f"from transformers.models.{self.port} import configuration_{self.port}\n\n\n"
            f"class {self.config_class}(configuration_{self.port}.{self.port_config}):\n"
            f"    model_type = {self.model_type!r}\n"
        )
        config_import = f"from .{self.config_module} import {self.config_class}\n" if self.own_config else ""
        model = (
            f"from transformers.models.{self.port} import modeling_{self.port}\n"
            f"from transformers.models.{self.port}.configuration_{self.port} import {self.port_config}\n"
            f"from transformers.masking_utils import create_bidirectional_mask\n\n"
            f"{config_import}\n\n"
            f"class {self.model_class}(modeling_{self.port}.{self.port_model}):\n"
            f"    config_class = {self.config_class if self.own_config else self.port_config}\n"
            f"{self.model_extra}"
        )
        code = {f"{self.model_module}.py": model}
        return {f"{self.config_module}.py": config, **code} if self.own_config else code


# nomic's NomicBertPreTrainedModel loads itself: its own from_pretrained(model_name, config=None, *inputs, **kwargs)
# reads `torch_dtype` and no other loading argument, and returns the model alone.
NOMIC_FROM_PRETRAINED = """
    @classmethod
    def from_pretrained(cls, model_name, config=None, *inputs, **kwargs):
        model = super().from_pretrained(model_name, config=config)
        dtype = kwargs.pop("torch_dtype", None)
        return model.to(dtype=dtype) if dtype is not None else model
"""
NOMIC = Family(
    "nomic-ai/nomic-bert-2048", "nomic_bert", "configuration_hf_nomic_bert", "NomicBertConfig",
    "modeling_hf_nomic_bert", "NomicBertModel", "nomic_bert", "NomicBertConfig", "NomicBertModel",
    "mean_tokens", NOMIC_PROMPTS, NOMIC_FROM_PRETRAINED,
)  # fmt: skip
GTE_NEW = Family(
    "Alibaba-NLP/new-impl", "new", "configuration", "NewConfig", "modeling", "NewModel", "gte", "GteConfig",
    "GteModel", "cls_token", {},
)  # fmt: skip


# gte-Qwen2-7B-instruct's modeling_qwen.Qwen2Model: Qwen2 whose every token attends to every other (not to padding),
# as it was trained; its config is transformers' own qwen2 (auto_map names the model class alone).
BIDIRECTIONAL_QWEN2 = """
    def __init__(self, config):
        super().__init__(config)
        for layer in self.layers:
            layer.self_attn.is_causal = False

    def forward(self, input_ids=None, attention_mask=None, **kwargs):
        embeds = self.embed_tokens(input_ids)
        mask = create_bidirectional_mask(config=self.config, inputs_embeds=embeds, attention_mask=attention_mask)
        return super().forward(inputs_embeds=embeds, attention_mask={"full_attention": mask}, **kwargs)
"""
GTE_QWEN2_PROMPTS = {
    "query": "Instruct: Given a web search query, retrieve relevant passages that answer the query\nQuery: "
}
GTE_QWEN2 = Family(
    "Alibaba-NLP/gte-Qwen2-7B-instruct", "qwen2", "", "", "modeling_qwen", "Qwen2Model", "qwen2", "Qwen2Config",
    "Qwen2Model", "lasttoken", GTE_QWEN2_PROMPTS, BIDIRECTIONAL_QWEN2, own_config=False,
    config_changes={"num_key_value_heads": TINY["num_attention_heads"]},
)  # fmt: skip


def write_folder(family: Family, folder: Path, *, elsewhere: bool = False, weights_as_saved: bool = False) -> None:
    """A tiny random model in the family's layout; its code named in the family's repository (`elsewhere`), or in
    the folder. `weights_as_saved`: the checkpoint as transformers' save_pretrained writes it (see below)."""
    import importlib

    from safetensors.torch import save_file
    from transformers import AutoTokenizer

    configuration = importlib.import_module(f"transformers.models.{family.port}.configuration_{family.port}")
    modeling = importlib.import_module(f"transformers.models.{family.port}.modeling_{family.port}")
    torch.manual_seed(26)
    settings: dict[str, Any] = {
        "vocab_size": 30528, "max_position_embeddings": 128, "pad_token_id": 0, **TINY, **family.config_changes
    }  # fmt: skip
    config = getattr(configuration, family.port_config)(**settings)
    model = getattr(modeling, family.port_model)(config).eval()
    folder.mkdir(parents=True)
    # The weights under the names the code's own modules give them: transformers' save_pretrained renames a
    # nomic_bert or gte checkpoint to its authors' original names, which only transformers' built-in class reads.
    if weights_as_saved:
        model.save_pretrained(folder)
    else:
        save_file({name: tensor.contiguous() for name, tensor in model.state_dict().items()},
                  str(folder / "model.safetensors"), metadata={"format": "pt"})  # fmt: skip
    config.architectures = [family.model_class]
    config.save_pretrained(folder)
    AutoTokenizer.from_pretrained(bundled_model_folder()).save_pretrained(folder)
    path = folder / "config.json"
    saved = json.loads(path.read_text())
    saved["model_type"] = family.model_type
    saved["auto_map"] = family.auto_map(elsewhere)
    path.write_text(json.dumps(saved, indent=2))
    if not elsewhere:
        for name, source in family.stand_in_code().items():
            (folder / name).write_text(source)
    # sentence-transformers 2.x's files, as these families' were saved.
    write_legacy_st_files(
        folder, pooling=family.pooling, max_seq_length=128, version="2.4.0.dev0", prompts=family.prompts
    )


def build_nomic_own_code(folder: Path) -> None:
    write_folder(NOMIC, folder)


def build_gte_new_own_code(folder: Path) -> None:
    write_folder(GTE_NEW, folder)


def build_gte_qwen2_own_code(folder: Path) -> None:
    write_folder(GTE_QWEN2, folder)


def build_nomic_code_elsewhere(folder: Path) -> None:
    """nomic-embed-text as downloaded: its auto_map names nomic-bert-2048's code, which is not in the folder."""
    write_folder(NOMIC, folder, elsewhere=True)


def build_gte_new_code_and_checkpoint_apart(folder: Path) -> None:
    """The folder's code names its weights otherwise than the checkpoint does (a checkpoint in new-impl's original
    names, `new.encoder.layer.0.attention.qkv_proj`, under code that names them as transformers' port: the mismatch
    another revision of the code makes)."""
    write_folder(GTE_NEW, folder, weights_as_saved=True)


# What nomic's NomicBertModel.forward does first: build the attention mask with a helper of transformers 4's
# PreTrainedModel that transformers 5 removed.
OLDER_TRANSFORMERS_FORWARD = """
    def forward(self, input_ids=None, attention_mask=None, **kwargs):
        self.get_extended_attention_mask(attention_mask, input_ids.shape)
        return super().forward(input_ids=input_ids, attention_mask=attention_mask, **kwargs)
"""


def build_gte_new_for_older_transformers(folder: Path) -> None:
    """GTE-new's layout whose code calls what transformers 5 no longer has, on its first pass."""
    write_folder(replace(GTE_NEW, model_extra=OLDER_TRANSFORMERS_FORWARD), folder)
