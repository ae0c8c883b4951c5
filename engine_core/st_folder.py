"""What a model folder's Sentence-Transformers files ask for, read as sentence-transformers reads them.

`modules.json` lists the modules a SentenceTransformer runs in order (Transformer, Pooling, then heads
on the pooled row: Dense, LayerNorm, Normalize, ...); each module's folder holds its config and
weights; `sentence_bert_config.json` holds the Transformer's options and
`config_sentence_transformers.json` the prompts, the similarity function and the model type. A SparseEncoder
(SPLADE) is a masked-LM Transformer followed by SpladePooling and nothing else. Both the
layouts of sentence-transformers 2-5 (`sentence_transformers.models.X`, boolean `pooling_mode_*` keys)
and of 6 (`sentence_transformers.base.modules...`, `pooling_mode`, `transformer_task`) are read.

Whatever poolserve cannot run exactly as sentence-transformers would is refused here, by name, in one
sentence (MetadataError): a module, an option, a value. Nothing is skipped. What one module's files say is
read by engine_core/st_modules.py; a SparseEncoder's by st_sparse.py, a MultiVectorEncoder's by
st_multi_vector.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

from engine_core.st_chain import read_embedding_chain
from engine_core.st_modules import (
    CROSS_ENCODER,
    LLM_RERANKER_TASK,
    MULTI_VECTOR_ENCODER,
    SENTENCE_TRANSFORMER,
    SPARSE_ENCODER,
    TRANSFORMER_TASKS,
    MetadataError,
    StFolder,
    describe,
    module_class,
    read_heads,
    read_json,
    read_transformer_config,
)
from engine_core.st_multi_vector import read_late_interaction, read_token_modules
from engine_core.st_router import ROUTER_MODULES, read_router
from engine_core.st_sparse import read_sparse_encoder
from poolserve.model_card import Similarity

# The model types whose first module may be a Router: its routes are SentenceTransformer chains (st_router.py), or
# an inference-free SPLADE's (st_sparse.py).
ROUTED_MODEL_TYPES = {SENTENCE_TRANSFORMER, SPARSE_ENCODER}
SIMILARITY_FUNCTIONS = ("cosine", "dot", "euclidean", "manhattan")

# Modules that are sentence-transformers' own but that poolserve does not run, and why.
REFUSED_MODULES = {
    "CLIPModel": (
        "Sentence-Transformers' CLIPModel module is not supported: serve the transformers CLIP folder it wraps "
        "instead, which poolserve runs as CLIP"
    ),
    "SparseStaticEmbedding": (
        "a SparseStaticEmbedding module (inference-free SPLADE's per-token weights) is served as a Router's query "
        "route only, beside a SPLADE document route; poolserve serves SPLADE as a masked-LM Transformer followed by "
        "SpladePooling"
    ),
    "SparseAutoEncoder": (
        "a SparseAutoEncoder module (a CSR model's sparse projection of a dense embedding) is not supported"
    ),
}

# What marks a PyLate save whatever its model_type says: its settings, and its own modules. One whose model_type
# is 'ColBERT' is read by engine_core/pylate_folder.py; any other goes down paths of sentence-transformers
# (converting a SentenceTransformer) that poolserve does not follow.
# (sentence-transformers' own list: any of them makes MultiVectorEncoder translate PyLate's settings.)
PYLATE_SETTINGS = {
    "query_prefix", "document_prefix", "query_length", "document_length", "query_expansion", "do_query_expansion",
    "attend_to_expansion_tokens", "attend_to_mask_tokens", "skiplist_words",
}  # fmt: skip


def read_st_folder(folder: Path) -> StFolder:
    """The folder's modules and options, as sentence-transformers would run them; MetadataError for
    anything poolserve cannot run exactly."""
    settings_path = folder / "config_sentence_transformers.json"
    settings: dict[str, Any] = read_json(settings_path) if settings_path.is_file() else {}
    modules_path = folder / "modules.json"
    if not modules_path.is_file():
        return StFolder()
    model_type = str(settings.get("model_type") or SENTENCE_TRANSFORMER)
    modules: list[dict[str, Any]] = read_json(modules_path)
    if PYLATE_SETTINGS & set(settings) or any(str(m.get("type", "")).startswith("pylate.") for m in modules):
        # Served as a SentenceTransformer, it would lose its projection.
        raise MetadataError(
            f"this folder holds PyLate's settings or modules under model_type {model_type!r}; poolserve serves "
            "PyLate's layout where config_sentence_transformers.json says model_type 'ColBERT', as PyLate saves it"
        )
    if model_type not in TRANSFORMER_TASKS:
        raise MetadataError(
            f"config_sentence_transformers.json says model_type {model_type!r}; poolserve serves "
            f"{SENTENCE_TRANSFORMER}, {CROSS_ENCODER}, {SPARSE_ENCODER} and {MULTI_VECTOR_ENCODER} folders"
        )
    if not modules:
        raise MetadataError("modules.json lists no modules")
    for module in modules:
        name = module_class(module)
        if not name:
            raise MetadataError(
                f"{describe(module)} is custom code, not one of sentence-transformers' own modules, which are all "
                "poolserve runs"
            )
        if name in REFUSED_MODULES:
            raise MetadataError(REFUSED_MODULES[name])
        if name in ROUTER_MODULES and (module is not modules[0] or model_type not in ROUTED_MODEL_TYPES):
            raise MetadataError(
                f"a {name} module (separate query and document paths) is served first in a SentenceTransformer or "
                f"a SparseEncoder; this one is module {module.get('idx', '?')} of a {model_type}"
            )
    first, rest = modules[0], modules[1:]
    prompts, default_prompt_name = read_prompts(settings, model_type)
    # A SparseEncoder compares by the dot product unless its files name another function.
    similarity = (
        "cosine" if model_type == MULTI_VECTOR_ENCODER
        else read_similarity(settings, "dot" if model_type == SPARSE_ENCODER else "cosine")
    )  # fmt: skip
    if model_type == SPARSE_ENCODER:
        return read_sparse_encoder(
            folder, modules, settings, prompts=prompts, default_prompt_name=default_prompt_name, similarity=similarity
        )
    shared: dict[str, Any] = {"prompts": prompts, "default_prompt_name": default_prompt_name, "similarity": similarity}
    if model_type == SENTENCE_TRANSFORMER:
        if module_class(first) == "StaticEmbedding":
            # A static model (engine_core/static_model.py): the mean of per-token vectors, then its heads.
            heads, normalize = read_heads(folder, rest)
            return StFolder(
                has_modules=True, static_folder=folder / str(first.get("path", "")), heads=heads, normalize=normalize,
                **shared,
            )  # fmt: skip
        if module_class(first) in ROUTER_MODULES:
            return read_router(folder, first, rest, **shared)
        return read_embedding_chain(folder, modules, **shared)
    if module_class(first) != "Transformer":
        raise MetadataError(f"the first module is {describe(first)}; poolserve needs a Transformer module first")
    transformer_folder = folder / str(first.get("path", ""))
    transformer = read_transformer_config(transformer_folder, model_type)
    common: dict[str, Any] = {
        "has_modules": True,
        "model_type": model_type,
        "transformer_folder": transformer_folder,
        "max_seq_length": transformer.get("max_seq_length") or None,
        "do_lower_case": bool(transformer.get("do_lower_case", False)),
        "prompts": prompts,
        "default_prompt_name": default_prompt_name,
        "similarity": similarity,
    }
    if model_type == CROSS_ENCODER:
        is_llm = transformer.get("transformer_task") == LLM_RERANKER_TASK
        modalities = transformer.get("modality_config")
        logit_score = read_logit_score(folder, rest) if is_llm else None
        if rest and not is_llm:
            raise MetadataError(f"this CrossEncoder has modules after its Transformer ({describe(rest[0])})")
        if any(prompts.values()):
            raise MetadataError("prompts on a CrossEncoder are not supported yet")
        activation = settings.get("activation_fn")
        return StFolder(
            **common, activation_fn=str(activation) if activation else None, logit_score=logit_score,
            renders_messages=None if modalities is None else "message" in modalities,
        )  # fmt: skip
    heads, normalize, skiplist = read_token_modules(folder, rest)  # a MultiVectorEncoder
    late = read_late_interaction(transformer, settings, skiplist)
    return StFolder(**common, heads=heads, normalize=normalize, late_interaction=late)


def read_similarity(settings: dict[str, Any], default: Similarity = "cosine") -> Similarity:
    similarity = str(settings.get("similarity_fn_name") or default)
    if similarity not in SIMILARITY_FUNCTIONS:
        raise MetadataError(f"similarity_fn_name {similarity!r} is not one of {', '.join(SIMILARITY_FUNCTIONS)}")
    return cast(Similarity, similarity)


def read_logit_score(folder: Path, modules: list[dict[str, Any]]) -> tuple[int, int | None]:
    """A causal CrossEncoder's LogitScore: the (true, false) token ids whose logits at the last token score a pair."""
    if len(modules) != 1 or module_class(modules[0]) != "LogitScore":
        found = describe(modules[0]) if modules else "nothing"
        raise MetadataError(
            f"this CrossEncoder's language model is followed by {found}; poolserve needs one LogitScore"
        )
    module = modules[0]
    config: dict[str, Any] = read_json(folder / str(module.get("path", "")) / "config.json")
    unknown = sorted(set(config) - {"true_token_id", "false_token_id", "module_input_name"})
    if unknown:
        raise MetadataError(f"the {describe(module)} sets {unknown}, which poolserve does not apply")
    if config.get("module_input_name", "causal_logits") != "causal_logits":
        raise MetadataError(f"the {describe(module)} reads {config['module_input_name']!r}, not the causal logits")
    false_id = config.get("false_token_id")
    return int(config["true_token_id"]), None if false_id is None else int(false_id)


# A SentenceTransformer always has these prompts, "" unless saved otherwise: so encode_query with no saved
# "query" prompt uses none, rather than the default prompt.
DEFAULT_PROMPTS = {
    SENTENCE_TRANSFORMER: {"query": "", "document": ""},
    SPARSE_ENCODER: {"query": "", "document": ""},
    MULTI_VECTOR_ENCODER: {"query": "", "document": ""},
}


def read_prompts(settings: dict[str, Any], model_type: str) -> tuple[dict[str, str], str | None]:
    """Prompts as sentence-transformers keeps them (a null prompt is ""), and the default prompt's name."""
    saved = {str(name): str(text or "") for name, text in (settings.get("prompts") or {}).items()}
    prompts = {**DEFAULT_PROMPTS.get(model_type, {}), **saved}
    default = settings.get("default_prompt_name")
    if default is not None and default not in prompts:
        raise MetadataError(f"default_prompt_name {default!r} is not one of the prompts {sorted(prompts)}")
    return prompts, default
