from __future__ import annotations

import json
from pathlib import Path

import pytest

from engine_core.st_metadata import MetadataError, PoolingMetadata, pooling_mode, read_pooling_metadata


def write_st_folder(folder: Path, pooling: dict[str, object], normalize: bool, max_seq_length: int | None) -> Path:
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
    ]
    if normalize:
        modules.append({"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"})
    (folder / "modules.json").write_text(json.dumps(modules))
    (folder / "1_Pooling").mkdir()
    (folder / "1_Pooling" / "config.json").write_text(json.dumps(pooling))
    if max_seq_length is not None:
        (folder / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": max_seq_length}))
    return folder


def test_the_bundled_model_asks_for_mean_pooling_normalized_at_256(bundled_model: Path) -> None:
    assert read_pooling_metadata(bundled_model) == PoolingMetadata("mean", True, 256)


def test_a_folder_without_sentence_transformers_files_says_nothing(tmp_path: Path) -> None:
    assert read_pooling_metadata(tmp_path) == PoolingMetadata(None, None, None)


def test_cls_pooling_without_normalize(tmp_path: Path) -> None:
    write_st_folder(tmp_path, {"pooling_mode_cls_token": True, "pooling_mode_mean_tokens": False}, False, None)
    assert read_pooling_metadata(tmp_path) == PoolingMetadata("cls", False, None)


@pytest.mark.parametrize(
    ("config", "mode"),
    [
        ({"pooling_mode_lasttoken": True}, "last"),
        ({"pooling_mode_mean_tokens": True, "pooling_mode_cls_token": False}, "mean"),
        ({"pooling_mode": "lasttoken"}, "last"),
        ({"pooling_mode": "cls"}, "cls"),
    ],
)
def test_pooling_modes(config: dict[str, object], mode: str) -> None:
    assert pooling_mode(config) == mode


@pytest.mark.parametrize(
    "config",
    [
        {"pooling_mode_max_tokens": True},
        {"pooling_mode_mean_tokens": True, "pooling_mode_cls_token": True},
        {},
    ],
)
def test_unsupported_pooling_is_refused_with_a_reason(config: dict[str, object]) -> None:
    with pytest.raises(MetadataError, match="pooling"):
        pooling_mode(config)
