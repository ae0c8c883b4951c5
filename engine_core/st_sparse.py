"""A SparseEncoder's files (SPLADE): a masked-LM Transformer, then SpladePooling, nothing after it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from engine_core.st_modules import (
    SPARSE_ENCODER,
    MetadataError,
    SpladeOptions,
    StFolder,
    describe,
    module_class,
    read_json,
    read_transformer_config,
)
from poolserve.protocol import Similarity

# A SparseEncoder's Transformer: 6's Transformer with transformer_task "fill-mask", or 5's MLMTransformer.
MLM_TRANSFORMERS = {"Transformer", "MLMTransformer"}
SPLADE_POOLING_KEYS = {"pooling_strategy", "activation_function", "embedding_dimension", "word_embedding_dimension",
                       "chunk_size"}  # fmt: skip


def read_sparse_encoder(
    folder: Path,
    modules: list[dict[str, Any]],
    settings: dict[str, Any],
    *,
    prompts: dict[str, str],
    default_prompt_name: str | None,
    similarity: Similarity,
) -> StFolder:
    """A SPLADE SparseEncoder: a masked-LM Transformer, then SpladePooling, nothing after it."""
    first = modules[0]
    if module_class(first) not in MLM_TRANSFORMERS:
        raise MetadataError(
            f"the first module of this SparseEncoder is {describe(first)}; poolserve serves SPLADE as a masked-LM "
            "Transformer followed by SpladePooling"
        )
    transformer_folder = folder / str(first.get("path", ""))
    transformer = read_transformer_config(transformer_folder, SPARSE_ENCODER)
    if module_class(first) == "Transformer" and transformer.get("transformer_task") != "fill-mask":
        # sentence-transformers 6 runs such a Transformer as a feature extractor: SpladePooling then pools hidden
        # states, not a masked LM's logits.
        raise MetadataError("this SparseEncoder's Transformer has no transformer_task 'fill-mask' (no MLM head)")
    if len(modules) < 2 or module_class(modules[1]) != "SpladePooling":
        found = describe(modules[1]) if len(modules) > 1 else "nothing"
        raise MetadataError(
            f"the SparseEncoder's Transformer is followed by {found}; poolserve needs SpladePooling next"
        )
    if len(modules) > 2:
        raise MetadataError(f"this SparseEncoder has modules after its SpladePooling ({describe(modules[2])})")
    max_active_dims = settings.get("max_active_dims")
    if max_active_dims is not None and (type(max_active_dims) is not int or max_active_dims < 1):
        raise MetadataError(f"max_active_dims {max_active_dims!r} is not a positive integer")
    return StFolder(
        has_modules=True, model_type=SPARSE_ENCODER, transformer_folder=transformer_folder,
        max_seq_length=transformer.get("max_seq_length") or None,
        do_lower_case=bool(transformer.get("do_lower_case", False)), prompts=prompts,
        default_prompt_name=default_prompt_name, similarity=similarity,
        splade=read_splade_pooling(folder / str(modules[1].get("path", "")), modules[1]),
        max_active_dims=max_active_dims,
    )  # fmt: skip


def read_splade_pooling(folder: Path, module: dict[str, Any]) -> SpladeOptions:
    """SpladePooling's config; its chunk_size only cuts the same sums and maxima into pieces."""
    config: dict[str, Any] = read_json(folder / "config.json")
    unknown = sorted(set(config) - SPLADE_POOLING_KEYS)
    if unknown:
        raise MetadataError(f"the {describe(module)} sets {unknown}, which poolserve does not apply")
    options = SpladeOptions(str(config.get("pooling_strategy", "max")), str(config.get("activation_function", "relu")))
    if options.pooling_strategy not in ("max", "sum"):
        raise MetadataError(f"SpladePooling's pooling_strategy {options.pooling_strategy!r} is not max or sum")
    if options.activation_function not in ("relu", "log1p_relu"):
        raise MetadataError(
            f"SpladePooling's activation_function {options.activation_function!r} is not relu or log1p_relu"
        )
    return options
