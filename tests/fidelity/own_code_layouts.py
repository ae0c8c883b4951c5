"""Folders whose config.json runs their own model code (`auto_map`, --trust-remote-code), in NomicBert's layout.

nomic-embed-text ships a config of model_type `nomic_bert` whose auto_map takes its code from another repository
(`nomic-ai/nomic-bert-2048--modeling_hf_nomic_bert.NomicBertModel`), Sentence-Transformers files in the 2.x layout
(Transformer, mean Pooling, Normalize) and `search_query: `/`search_document: ` prompts. The code in the served
folder here is transformers' own NomicBert port, named as the folder's `modeling_hf_nomic_bert.py`: nomic's file is
not vendored into this repository, so these layouts hold the remote-code path (auto_map, the dynamic module,
prompts, pooling) against SentenceTransformer(trust_remote_code=True) on the same code, not nomic's code itself.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from bench.models import TINY, bundled_model_folder
from tests.fidelity.legacy_st_files import write_legacy_st_files

NOMIC_CODE_REPOSITORY = "nomic-ai/nomic-bert-2048"
NOMIC_PROMPTS = {
    "query": "search_query: ",
    "document": "search_document: ",
    "classification": "classification: ",
    "clustering": "clustering: ",
}
# Stand-ins for nomic's configuration_hf_nomic_bert.py and modeling_hf_nomic_bert.py (see above): subclasses, so
# that transformers registering the folder's classes for its Auto classes leaves its own NomicBert untouched.
STAND_IN_CODE = {
    "configuration_hf_nomic_bert.py": """from transformers.models.nomic_bert import configuration_nomic_bert


class NomicBertConfig(configuration_nomic_bert.NomicBertConfig):
    pass
""",
    "modeling_hf_nomic_bert.py": """from transformers.models.nomic_bert import modeling_nomic_bert

from .configuration_hf_nomic_bert import NomicBertConfig


class NomicBertModel(modeling_nomic_bert.NomicBertModel):
    config_class = NomicBertConfig
""",
}


def nomic_auto_map(repository: str | None) -> dict[str, str]:
    prefix = f"{repository}--" if repository else ""
    return {
        "AutoConfig": f"{prefix}configuration_hf_nomic_bert.NomicBertConfig",
        "AutoModel": f"{prefix}modeling_hf_nomic_bert.NomicBertModel",
    }


def write_nomic_folder(folder: Path, repository: str | None, *, weights_as_saved: bool = False) -> None:
    """A tiny random NomicBert in nomic-embed-text's layout; its code named in `repository`, or in the folder.
    `weights_as_saved`: the checkpoint as transformers' save_pretrained writes it (see below)."""
    from safetensors.torch import save_file
    from transformers import AutoTokenizer, NomicBertConfig, NomicBertModel

    torch.manual_seed(26)
    config = NomicBertConfig(vocab_size=30528, max_position_embeddings=128, **TINY)
    model = NomicBertModel(config).eval()
    config.architectures = ["NomicBertModel"]
    # The weights under the names the code's own modules give them: transformers' save_pretrained renames a
    # nomic_bert checkpoint to nomic's original names, which only transformers' built-in class reads back.
    folder.mkdir(parents=True)
    if weights_as_saved:
        model.save_pretrained(folder)
    else:
        save_file({name: tensor.contiguous() for name, tensor in model.state_dict().items()},
                  str(folder / "model.safetensors"), metadata={"format": "pt"})  # fmt: skip
    config.save_pretrained(folder)
    AutoTokenizer.from_pretrained(bundled_model_folder()).save_pretrained(folder)
    path = folder / "config.json"
    saved = json.loads(path.read_text())
    saved["auto_map"] = nomic_auto_map(repository)
    path.write_text(json.dumps(saved, indent=2))
    if repository is None:
        for name, source in STAND_IN_CODE.items():
            (folder / name).write_text(source)
    # sentence-transformers 2.x's files, as nomic-embed-text's were saved.
    write_legacy_st_files(
        folder, pooling="mean_tokens", max_seq_length=128, version="2.4.0.dev0", prompts=NOMIC_PROMPTS
    )


def build_nomic_own_code(folder: Path) -> None:
    write_nomic_folder(folder, repository=None)


def build_nomic_code_elsewhere(folder: Path) -> None:
    """nomic-embed-text as downloaded: its auto_map names nomic-bert-2048's code, which is not in the folder."""
    write_nomic_folder(folder, repository=NOMIC_CODE_REPOSITORY)


def build_nomic_code_and_checkpoint_apart(folder: Path) -> None:
    """The folder's code names its weights otherwise than the checkpoint does (a checkpoint in nomic's original
    names under code that names them as transformers' port: the mismatch another revision of the code makes)."""
    write_nomic_folder(folder, repository=None, weights_as_saved=True)
