"""A SentenceTransformer's module chain: a Transformer, a Pooling, then heads on the pooled row (Dense, LayerNorm,
Normalize, ...), read as sentence-transformers reads it; a Router's route is one such chain too (st_router.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from engine_core.st_modules import (
    SENTENCE_TRANSFORMER,
    MetadataError,
    StFolder,
    describe,
    module_class,
    read_heads,
    read_json,
    read_transformer_config,
)

# sentence-transformers' pooling modes, in the order Pooling concatenates them.
ST_POOLING_MODES = ("cls", "max", "mean", "mean_sqrt_len_tokens", "weightedmean", "lasttoken")
LEGACY_POOLING_KEYS = {
    "pooling_mode_cls_token": "cls",
    "pooling_mode_max_tokens": "max",
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len_tokens",
    "pooling_mode_weightedmean_tokens": "weightedmean",
    "pooling_mode_lasttoken": "lasttoken",
}


def read_embedding_chain(folder: Path, modules: list[dict[str, Any]], **settings: Any) -> StFolder:
    """A Transformer, a Pooling and the heads after it (`modules`, their paths within `folder`), with the model's
    own settings (prompts, similarity) as given."""
    first, rest = modules[0], modules[1:]
    if module_class(first) != "Transformer":
        raise MetadataError(f"the first module is {describe(first)}; poolserve needs a Transformer module first")
    transformer_folder = folder / str(first.get("path", ""))
    transformer = read_transformer_config(transformer_folder, SENTENCE_TRANSFORMER)
    if not rest or module_class(rest[0]) != "Pooling":
        found = describe(rest[0]) if rest else "nothing"
        raise MetadataError(f"the Transformer module is followed by {found}; poolserve needs a Pooling module next")
    pooling, dimension, includes_prompt = read_pooling(folder / str(rest[0].get("path", "")))
    heads, normalize = read_heads(folder, rest[1:])
    message = (transformer.get("modality_config") or {}).get("message")
    return StFolder(
        renders_messages=message is not None, message_format=str((message or {}).get("format", "")),
        has_modules=True, model_type=SENTENCE_TRANSFORMER, transformer_folder=transformer_folder,
        max_seq_length=transformer.get("max_seq_length") or None,
        do_lower_case=bool(transformer.get("do_lower_case", False)), pooling=pooling, embedding_dimension=dimension,
        pooling_includes_prompt=includes_prompt, heads=heads, normalize=normalize, **settings,
    )  # fmt: skip


def read_pooling(folder: Path) -> tuple[tuple[str, ...], int | None, bool]:
    """Pooling modes (sentence-transformers' names, its concatenation order kept), the token width, and whether
    the prompt's tokens are pooled (`include_prompt`, true unless saved false)."""
    config: dict[str, Any] = read_json(folder / "config.json")
    named = config.get("pooling_mode")
    if named is not None:
        modes = (named,) if isinstance(named, str) else tuple(named)
    else:
        # sentence-transformers 2-5: one boolean per mode; none set means mean.
        modes = tuple(mode for key, mode in LEGACY_POOLING_KEYS.items() if config.get(key)) or ("mean",)
    unknown = [mode for mode in modes if mode not in ST_POOLING_MODES]
    if unknown or not modes:
        raise MetadataError(f"pooling mode {unknown or modes} is not one of {', '.join(ST_POOLING_MODES)}")
    dimension = config.get("embedding_dimension", config.get("word_embedding_dimension"))
    return modes, int(dimension) if dimension else None, config.get("include_prompt", True) is not False
