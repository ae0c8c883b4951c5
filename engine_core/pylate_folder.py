"""PyLate's ColBERT layout (`model_type: ColBERT`), read as sentence-transformers 6's MultiVectorEncoder reads it.

PyLate saves a Transformer and its Dense projection (`pylate.models.Dense.Dense`, sentence-transformers' Dense
with `use_residual`), and keeps the rest in config_sentence_transformers.json: the query and document prefixes
(inserted as tokens of their own when it trained), the query and document lengths, whether queries are expanded
and whether the encoder attends to the expansion, and the skiplist. sentence-transformers turns these into its
own modules: the prefixes go before the prompts and are registered as special tokens (engine_core/multi_vector.py,
`register_prefix_tokens`), the Dense works on every token, and a MultiVectorMask (the saved skiplist, else
punctuation) and a token-level Normalize follow it.
"""

from __future__ import annotations

import string
from pathlib import Path
from typing import Any

from engine_core.st_folder import read_prompts
from engine_core.st_modules import (
    MULTI_VECTOR_ENCODER,
    MULTI_VECTOR_KEYS,
    TOKEN_EMBEDDINGS,
    LateInteractionFolder,
    MetadataError,
    StFolder,
    describe,
    module_class,
    read_heads,
    read_json,
    read_transformer_config,
)
from engine_core.st_multi_vector import LATE_SIMILARITIES

PYLATE_MODEL_TYPE = "ColBERT"
# sentence-transformers' alias for PyLate's one module (its `_CLASS_REF_ALIASES`).
PYLATE_DENSE = "pylate.models.Dense.Dense"
ST_DENSE = "sentence_transformers.base.modules.dense.Dense"
# PyLate's default query length when expansion is on and it saved none (ColBERT's 32).
DEFAULT_QUERY_LENGTH = 32


def is_pylate_folder(folder: Path) -> bool:
    settings_path = folder / "config_sentence_transformers.json"
    if not (folder / "modules.json").is_file() or not settings_path.is_file():
        return False
    return bool(read_json(settings_path).get("model_type") == PYLATE_MODEL_TYPE)


def read_pylate_folder(folder: Path) -> StFolder:
    settings: dict[str, Any] = read_json(folder / "config_sentence_transformers.json")
    modules: list[dict[str, Any]] = [
        {**module, "type": ST_DENSE} if module.get("type") == PYLATE_DENSE else module
        for module in read_json(folder / "modules.json")
    ]
    if not modules or module_class(modules[0]) != "Transformer":
        raise MetadataError("this PyLate model's first module is not a Transformer")
    for module in modules[1:]:
        # sentence-transformers appends its own MultiVectorMask and Normalize to a PyLate save's modules.
        if module_class(module) != "Dense":
            raise MetadataError(f"the {describe(module)} in a PyLate model (which saves a Transformer and Dense "
                                "modules) is not supported")  # fmt: skip
    transformer_folder = folder / str(modules[0].get("path", ""))
    transformer = read_transformer_config(transformer_folder, MULTI_VECTOR_ENCODER)
    if MULTI_VECTOR_KEYS & set(transformer):
        raise MetadataError("this PyLate model's sentence_bert_config.json sets query or document lengths of its own "
                            "beside PyLate's settings, which poolserve does not merge")  # fmt: skip
    heads, _ = read_heads(folder, modules[1:], TOKEN_EMBEDDINGS)
    prefixes = {
        role: str(settings.get(key) or "")
        for role, key in (("query", "query_prefix"), ("document", "document_prefix"))
        if key in settings
    }
    saved = dict(settings.get("prompts") or {})
    for role, prefix in prefixes.items():
        saved[role] = prefix + str(saved.get(role) or "").removeprefix(prefix)
    prompts, default_prompt_name = read_prompts({**settings, "prompts": saved}, MULTI_VECTOR_ENCODER)
    similarity = str(settings.get("similarity_fn_name") or "")
    skiplist = settings.get("skiplist_words")
    return StFolder(
        has_modules=True,
        model_type=MULTI_VECTOR_ENCODER,
        transformer_folder=transformer_folder,
        heads=heads,
        normalize=True,
        max_seq_length=transformer.get("max_seq_length") or None,
        do_lower_case=bool(transformer.get("do_lower_case", False)),
        prompts=prompts,
        default_prompt_name=default_prompt_name,
        late_interaction=pylate_late_interaction(
            settings,
            skiplist=tuple(string.punctuation) if skiplist is None else tuple(str(word) for word in skiplist),
            # sentence-transformers keeps a saved maxsim or meanmaxsim and falls back to maxsim for any other name.
            similarity=similarity if similarity in LATE_SIMILARITIES else "maxsim",
        ),
        legacy_prefixes=tuple(prefix for prefix in prefixes.values() if prefix),
    )


def pylate_late_interaction(
    settings: dict[str, Any], *, skiplist: tuple[str, ...], similarity: str
) -> LateInteractionFolder:
    """PyLate's flat settings as sentence-transformers translates them (MultiVectorEncoder._parse_model_config):
    expansion on unless `do_query_expansion` is false, to `query_length` (else 32), attended with
    `attend_to_expansion_tokens`; `query_length` is then the expansion's, not a cut of its own."""
    if "query_expansion" in settings:
        raise MetadataError("config_sentence_transformers.json sets query_expansion, which poolserve reads only from "
                            "the Transformer's sentence_bert_config.json")  # fmt: skip
    query_length = int(settings.get("query_length") or 0)
    document_length = int(settings.get("document_length") or 0)
    if settings.get("do_query_expansion") is False:
        return LateInteractionFolder(query_length, document_length, skiplist_words=skiplist, similarity=similarity)
    attend = settings.get("attend_to_expansion_tokens", settings.get("attend_to_mask_tokens"))
    return LateInteractionFolder(
        0,
        document_length,
        expansion=query_length or DEFAULT_QUERY_LENGTH,
        attend_expansion=bool(attend),
        skiplist_words=skiplist,
        similarity=similarity,
    )
