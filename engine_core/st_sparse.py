"""A SparseEncoder's files (SPLADE): a masked-LM Transformer, then SpladePooling, nothing after it; or an inference-free
SPLADE, a Router of a SparseStaticEmbedding (per-token weights) for queries and such a SPLADE for documents."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from engine_core.st_modules import (
    SPARSE_ENCODER,
    MetadataError,
    RouterFolder,
    SpladeOptions,
    StFolder,
    describe,
    module_class,
    read_json,
    read_transformer_config,
)
from engine_core.st_router import ROUTER_MODULES, read_routes
from poolserve.model_card import Similarity

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
    """A SPLADE SparseEncoder: a masked-LM Transformer, then SpladePooling, nothing after it; or a Router of a
    SparseStaticEmbedding for queries and such a chain for documents."""
    first = modules[0]
    if module_class(first) in ROUTER_MODULES:
        return read_inference_free(
            folder, modules, settings, prompts=prompts, default_prompt_name=default_prompt_name, similarity=similarity
        )
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


def read_inference_free(
    folder: Path,
    modules: list[dict[str, Any]],
    settings: dict[str, Any],
    *,
    prompts: dict[str, str],
    default_prompt_name: str | None,
    similarity: Similarity,
) -> StFolder:
    """An inference-free SPLADE (opensearch's): a Router whose query route is one SparseStaticEmbedding (each token
    present in the query weighs its trained weight) and whose document route is a SPLADE chain, nothing after it."""
    router, rest = modules[0], modules[1:]
    if rest:
        raise MetadataError(f"this SparseEncoder has modules after its Router ({describe(rest[0])})")
    routes = read_routes(folder, router)
    shared: dict[str, Any] = {"prompts": prompts, "default_prompt_name": default_prompt_name, "similarity": similarity}
    document = read_sparse_encoder(folder, routes.modules[routes.document], settings, **shared)
    if routes.query == routes.document:  # one path for every text
        return document
    query = routes.modules[routes.query]
    if len(query) != 1 or module_class(query[0]) != "SparseStaticEmbedding":
        raise MetadataError(
            f"the Router's query route {routes.query!r} runs {', '.join(describe(m) for m in query)}; poolserve serves "
            "a sparse Router whose query route is one SparseStaticEmbedding (an inference-free SPLADE)"
        )
    static = folder / str(query[0].get("path", ""))
    config: dict[str, Any] = read_json(static / "config.json") if (static / "config.json").is_file() else {}
    unknown = sorted(set(config) - {"frozen"})
    if unknown:
        raise MetadataError(f"the {describe(query[0])} sets {unknown}, which poolserve does not apply")
    names = (routes.query, routes.document)
    static_chain = StFolder(has_modules=True, model_type=SPARSE_ENCODER, sparse_static_folder=static, **shared)
    return replace(document, router=RouterFolder(static_chain, document, routes.default, names))


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
