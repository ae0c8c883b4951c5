"""A MultiVectorEncoder's files (late interaction, ColBERT): heads on every token's vector, one MultiVectorMask, and
how queries and documents are treated."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from engine_core.st_modules import (
    TOKEN_EMBEDDINGS,
    Head,
    LateInteractionFolder,
    MetadataError,
    describe,
    module_class,
    read_heads,
    read_json,
)

LATE_SIMILARITIES = ("maxsim", "meanmaxsim")


def read_token_modules(folder: Path, modules: list[dict[str, Any]]) -> tuple[tuple[Head, ...], bool, tuple[str, ...]]:
    """A MultiVectorEncoder's modules after its Transformer: the heads on every token's vector, whether the
    last is a Normalize, and the words its one MultiVectorMask leaves out of documents."""
    masks = [module for module in modules if module_class(module) == "MultiVectorMask"]
    if len(masks) != 1:
        raise MetadataError(f"this MultiVectorEncoder has {len(masks)} MultiVectorMask modules; poolserve runs one")
    heads, normalize = read_heads(folder, [m for m in modules if m is not masks[0]], TOKEN_EMBEDDINGS)
    config: dict[str, Any] = read_json(folder / str(masks[0].get("path", "")) / "config.json")
    unknown = sorted(set(config) - {"skiplist_words", "skiplist_tasks", "keep_only_token_ids"})
    if unknown:
        raise MetadataError(f"the {describe(masks[0])} sets {unknown}, which poolserve does not apply")
    if list(config.get("skiplist_tasks") or ["document"]) != ["document"]:
        raise MetadataError(
            f"the {describe(masks[0])} applies its skiplist to {config['skiplist_tasks']}; poolserve applies one to "
            "documents only (sentence-transformers' default)"
        )
    if config.get("keep_only_token_ids") is not None:
        raise MetadataError(f"the {describe(masks[0])} keeps only some token ids (keep_only_token_ids), which "
                            "poolserve does not apply")  # fmt: skip
    return heads, normalize, tuple(str(word) for word in config.get("skiplist_words") or ())


def read_late_interaction(
    transformer: dict[str, Any], settings: dict[str, Any], skiplist: tuple[str, ...]
) -> LateInteractionFolder:
    """Queries' and documents' treatment from the Transformer's options, as sentence-transformers' Transformer
    validates them."""
    similarity = str(settings.get("similarity_fn_name") or "maxsim")
    if similarity not in LATE_SIMILARITIES:
        raise MetadataError(f"similarity_fn_name {similarity!r} is not one of {', '.join(LATE_SIMILARITIES)}")
    query_length = int(transformer.get("query_length") or 0)
    document_length = int(transformer.get("document_length") or 0)
    expansion: dict[str, Any] | None = transformer.get("query_expansion")
    if expansion is None:
        return LateInteractionFolder(query_length, document_length, skiplist_words=skiplist, similarity=similarity)
    unknown = sorted(set(expansion) - {"strategy", "attend", "token", "length"})
    strategy, length = expansion.get("strategy"), expansion.get("length")
    if unknown or strategy not in ("fixed", "min") or not isinstance(length, int) or length < 1:
        raise MetadataError(f"query_expansion {expansion} is not one sentence-transformers accepts")
    if query_length and query_length < length:
        raise MetadataError(f"query_length {query_length} is below the query_expansion length {length}")
    token = expansion.get("token")
    return LateInteractionFolder(
        query_length, document_length, expansion=length, expansion_is_fixed=strategy == "fixed",
        attend_expansion=bool(expansion.get("attend", False)), expansion_token=None if token is None else str(token),
        skiplist_words=skiplist, similarity=similarity,
    )  # fmt: skip
