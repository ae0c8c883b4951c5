"""Sentence-Transformers files as releases 2 to 4 wrote them (which 6 still reads): `sentence_transformers.models.X`
module types, boolean pooling keys, `max_seq_length` in sentence_bert_config.json."""

from __future__ import annotations

import json
from pathlib import Path

from bench.harness.models import TINY

POOLING_KEYS = ("cls_token", "mean_tokens", "max_tokens", "mean_sqrt_len_tokens", "lasttoken")


def write_legacy_st_files(
    folder: Path, *, pooling: str, max_seq_length: int, version: str, prompts: dict[str, str] | None = None
) -> None:
    """Transformer (the folder itself) → Pooling (`pooling`, one of POOLING_KEYS) → Normalize."""
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
        {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"},
    ]
    (folder / "modules.json").write_text(json.dumps(modules))
    settings = {"max_seq_length": max_seq_length, "do_lower_case": False}
    (folder / "sentence_bert_config.json").write_text(json.dumps(settings))
    (folder / "1_Pooling").mkdir()
    pooling_config = {"word_embedding_dimension": TINY["hidden_size"]}
    pooling_config.update({f"pooling_mode_{key}": key == pooling for key in POOLING_KEYS})
    (folder / "1_Pooling" / "config.json").write_text(json.dumps(pooling_config))
    (folder / "2_Normalize").mkdir()
    config = {"__version__": {"sentence_transformers": version}, "prompts": prompts or {}, "default_prompt_name": None}
    (folder / "config_sentence_transformers.json").write_text(json.dumps(config))
