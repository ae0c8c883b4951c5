"""What a model folder's Sentence-Transformers files say about pooling, normalization and length."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any


class MetadataError(ValueError):
    """The folder's Sentence-Transformers files ask for something poolserve cannot do."""


@dataclass(frozen=True, slots=True)
class PoolingMetadata:
    pooling: str | None
    normalize: bool | None
    max_seq_length: int | None


def read_json(path: Path) -> Any:
    with path.open(encoding="utf-8") as f:
        return json.load(f)


def read_pooling_metadata(folder: Path) -> PoolingMetadata:
    """Pooling, normalization and max length as the model's authors set them; None where unsaid."""
    modules_path = folder / "modules.json"
    if not modules_path.is_file():
        return PoolingMetadata(pooling=None, normalize=None, max_seq_length=None)
    modules = read_json(modules_path)
    pooling: str | None = None
    normalize = False
    for module in modules:
        kind = str(module.get("type", ""))
        if kind.endswith(".Pooling"):
            pooling = pooling_mode(read_json(folder / module.get("path", "") / "config.json"))
        elif kind.endswith(".Normalize"):
            normalize = True
    max_seq_length = None
    bert_config = folder / "sentence_bert_config.json"
    if bert_config.is_file():
        value = read_json(bert_config).get("max_seq_length")
        max_seq_length = int(value) if value else None
    return PoolingMetadata(pooling=pooling, normalize=normalize, max_seq_length=max_seq_length)


def pooling_mode(pooling_config: dict[str, Any]) -> str:
    """Map a Sentence-Transformers Pooling config to one of poolserve's modes."""
    if isinstance(pooling_config.get("pooling_mode"), str):
        named = {"mean": "mean", "cls": "cls", "lasttoken": "last"}.get(pooling_config["pooling_mode"])
        if named is None:
            raise MetadataError(f"pooling mode {pooling_config['pooling_mode']!r} is not supported")
        return named
    enabled = [key for key, value in pooling_config.items() if key.startswith("pooling_mode_") and value]
    modes = {
        "pooling_mode_mean_tokens": "mean",
        "pooling_mode_cls_token": "cls",
        "pooling_mode_lasttoken": "last",
    }
    if len(enabled) != 1 or enabled[0] not in modes:
        raise MetadataError(
            f"1_Pooling/config.json enables {enabled or 'no mode'}; poolserve supports exactly one of "
            "mean, cls or last-token pooling"
        )
    return modes[enabled[0]]
