"""What a model folder's Sentence-Transformers files ask for, read as sentence-transformers reads them.

`modules.json` lists the modules a SentenceTransformer runs in order (Transformer, Pooling, then heads
on the pooled row: Dense, LayerNorm, Normalize, ...); each module's folder holds its config and
weights; `sentence_bert_config.json` holds the Transformer's options and
`config_sentence_transformers.json` the prompts, the similarity function and the model type. A SparseEncoder
(SPLADE) is a masked-LM Transformer followed by SpladePooling and nothing else. Both the
layouts of sentence-transformers 2-5 (`sentence_transformers.models.X`, boolean `pooling_mode_*` keys)
and of 6 (`sentence_transformers.base.modules...`, `pooling_mode`, `transformer_task`) are read.

Whatever poolserve cannot run exactly as sentence-transformers would is refused here, by name, in one
sentence (MetadataError): a module, an option, a value. Nothing is skipped.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from poolserve.protocol import Similarity

ST_PACKAGE = "sentence_transformers."
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
# The model types poolserve serves: an embedder, a cross-encoder (a sequence classifier), a sparse encoder, and a
# late-interaction (ColBERT) model.
SENTENCE_TRANSFORMER = "SentenceTransformer"
CROSS_ENCODER = "CrossEncoder"
SPARSE_ENCODER = "SparseEncoder"
MULTI_VECTOR_ENCODER = "MultiVectorEncoder"
SENTENCE_EMBEDDING = "sentence_embedding"
TOKEN_EMBEDDINGS = "token_embeddings"
LATE_SIMILARITIES = ("maxsim", "meanmaxsim")
# A Transformer's options that only a MultiVectorEncoder reads (its queries' and documents' lengths, query expansion).
MULTI_VECTOR_KEYS = {"query_length", "document_length", "query_expansion"}
DEFAULT_DENSE_ACTIVATION = "torch.nn.modules.activation.Tanh"  # Dense's default when its config names none
SIMILARITY_FUNCTIONS = ("cosine", "dot", "euclidean", "manhattan")

# Modules that are sentence-transformers' own but that poolserve does not run, and why.
REFUSED_MODULES = {
    "Router": "a Router module (separate query and document paths) is not supported",
    "Asym": "an Asym module (separate query and document paths) is not supported",
    "CLIPModel": (
        "Sentence-Transformers' CLIPModel module is not supported: serve the transformers CLIP folder it wraps "
        "instead, which poolserve runs as CLIP"
    ),
    "SparseStaticEmbedding": (
        "a SparseStaticEmbedding module (inference-free SPLADE's per-token weights) is not supported; poolserve serves "
        "SPLADE as a masked-LM Transformer followed by SpladePooling"
    ),
    "SparseAutoEncoder": (
        "a SparseAutoEncoder module (a CSR model's sparse projection of a dense embedding) is not supported"
    ),
}
# A SparseEncoder's Transformer: 6's Transformer with transformer_task "fill-mask", or 5's MLMTransformer.
MLM_TRANSFORMERS = {"Transformer", "MLMTransformer"}
SPLADE_POOLING_KEYS = {"pooling_strategy", "activation_function", "embedding_dimension", "word_embedding_dimension",
                       "chunk_size"}  # fmt: skip

# Keys of sentence_bert_config.json, and of its argument dicts, that change nothing poolserve computes.
TRANSFORMER_KEYS = {"max_seq_length", "do_lower_case", "transformer_task", "modality_config", "module_output_name"}
ARGUMENT_DICTS = {"model_args", "model_kwargs", "config_args", "config_kwargs", "tokenizer_args", "processing_kwargs"}
# trust_remote_code is --trust-remote-code's business: the loader asks for it where the code needs it.
HARMLESS_ARGUMENTS = {"trust_remote_code"}
TRANSFORMER_TASKS = {
    SENTENCE_TRANSFORMER: "feature-extraction",
    CROSS_ENCODER: "sequence-classification",
    SPARSE_ENCODER: "fill-mask",
    MULTI_VECTOR_ENCODER: "feature-extraction",
}
# What marks a PyLate save whatever its model_type says: its settings, and its own modules. One whose model_type
# is 'ColBERT' is read by engine_core/pylate_folder.py; any other goes down paths of sentence-transformers
# (converting a SentenceTransformer) that poolserve does not follow.
# (sentence-transformers' own list: any of them makes MultiVectorEncoder translate PyLate's settings.)
PYLATE_SETTINGS = {
    "query_prefix", "document_prefix", "query_length", "document_length", "query_expansion", "do_query_expansion",
    "attend_to_expansion_tokens", "attend_to_mask_tokens", "skiplist_words",
}  # fmt: skip
# A CrossEncoder over a causal language model (transformer_task text-generation) scores a pair from its logits.
LLM_RERANKER_TASK = "text-generation"
TASK_REFUSALS = {
    "fill-mask": (
        "a Transformer with transformer_task 'fill-mask' (an MLM head) is served in a SparseEncoder followed by "
        "SpladePooling, not here"
    ),
    LLM_RERANKER_TASK: "a Transformer with transformer_task 'text-generation' is served in a CrossEncoder only (an "
    "LLM reranker)",
}


class MetadataError(ValueError):
    """The folder's Sentence-Transformers files ask for something poolserve cannot do exactly."""


@dataclass(frozen=True, slots=True)
class DenseHead:
    """sentence-transformers' Dense: activation(linear(x)), plus x (or a projection of it) with use_residual."""

    folder: Path
    in_features: int
    out_features: int
    bias: bool
    activation: str  # the import path of a torch.nn module class, as the config names it
    use_residual: bool = False


@dataclass(frozen=True, slots=True)
class LayerNormHead:
    folder: Path
    dimension: int


@dataclass(frozen=True, slots=True)
class NormalizeHead:
    """An L2 normalization followed by more heads (a trailing one is `StFolder.normalize`)."""


Head = DenseHead | LayerNormHead | NormalizeHead


@dataclass(frozen=True, slots=True)
class SpladeOptions:
    """SpladePooling's options: log1p(relu(logits)) per token (twice log1p for "log1p_relu"), then the max
    ("max") or the sum ("sum") over the input's tokens, one value per vocabulary entry."""

    pooling_strategy: str = "max"
    activation_function: str = "relu"


@dataclass(frozen=True, slots=True)
class LateInteractionFolder:
    """What a MultiVectorEncoder's Transformer and MultiVectorMask say about queries and documents (0: unsaid)."""

    query_length: int = 0
    document_length: int = 0
    # ColBERT's query expansion: the length queries are padded to (0: none), whether it is only a floor
    # (strategy "min") or also the ceiling ("fixed"), whether the model attends to the added tokens, and
    # which token they are (None: the tokenizer's mask token).
    expansion: int = 0
    expansion_is_fixed: bool = True
    attend_expansion: bool = False
    expansion_token: str | None = None
    skiplist_words: tuple[str, ...] = ()
    similarity: str = "maxsim"


@dataclass(frozen=True, slots=True)
class StFolder:
    """A folder's Sentence-Transformers description; `has_modules` False when it has none (a plain
    transformers folder), and then every field keeps its default."""

    has_modules: bool = False
    model_type: str = SENTENCE_TRANSFORMER
    # Where the transformers model and tokenizer live: the folder itself, or an old layout's subfolder.
    transformer_folder: Path | None = None
    # A StaticEmbedding's folder (its tokenizer.json and per-token vectors) in place of a Transformer.
    static_folder: Path | None = None
    # Pooling modes in sentence-transformers' names, concatenated in this order; () without Pooling.
    pooling: tuple[str, ...] = ()
    embedding_dimension: int | None = None
    heads: tuple[Head, ...] = ()
    # The last module is Normalize (None: no modules.json, so nothing said).
    normalize: bool | None = None
    max_seq_length: int | None = None
    do_lower_case: bool = False
    prompts: dict[str, str] = field(default_factory=dict)
    default_prompt_name: str | None = None
    similarity: Similarity = "cosine"
    # A CrossEncoder's activation_fn (an import path), None when unsaid.
    activation_fn: str | None = None
    # A CrossEncoder over a causal language model: its LogitScore module's (true, false) token ids.
    logit_score: tuple[int, int | None] | None = None
    # Whether the Transformer renders its inputs through the tokenizer's chat template (modality_config "message");
    # None when unsaid (files saved before sentence-transformers 6: text only).
    renders_messages: bool | None = None
    # A SparseEncoder's pooling (None for any other folder), and the most non-zero values it keeps per row.
    splade: SpladeOptions | None = None
    max_active_dims: int | None = None
    # A MultiVectorEncoder (ColBERT): its heads and normalization work on every token's vector.
    late_interaction: LateInteractionFolder | None = None
    # Markers a legacy ColBERT checkpoint (PyLate's, Stanford's) inserted as tokens of their own, which
    # sentence-transformers registers as special tokens (engine_core/multi_vector.py).
    legacy_prefixes: tuple[str, ...] = ()


def read_json(path: Path) -> Any:
    with path.open(encoding="utf-8") as f:
        return json.load(f)


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
    if module_class(first) == "StaticEmbedding" and model_type == SENTENCE_TRANSFORMER:
        # A static model (engine_core/static_model.py): the mean of per-token vectors, then its heads.
        heads, normalize = read_heads(folder, rest)
        return StFolder(
            has_modules=True, static_folder=folder / str(first.get("path", "")), heads=heads, normalize=normalize,
            prompts=prompts, default_prompt_name=default_prompt_name, similarity=similarity,
        )  # fmt: skip
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
    if model_type == MULTI_VECTOR_ENCODER:
        heads, normalize, skiplist = read_token_modules(folder, rest)
        late = read_late_interaction(transformer, settings, skiplist)
        return StFolder(**common, heads=heads, normalize=normalize, late_interaction=late)
    if not rest or module_class(rest[0]) != "Pooling":
        found = describe(rest[0]) if rest else "nothing"
        raise MetadataError(f"the Transformer module is followed by {found}; poolserve needs a Pooling module next")
    pooling, dimension = read_pooling(folder / str(rest[0].get("path", "")))
    heads, normalize = read_heads(folder, rest[1:])
    return StFolder(**common, pooling=pooling, embedding_dimension=dimension, heads=heads, normalize=normalize)


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


def read_similarity(settings: dict[str, Any], default: Similarity = "cosine") -> Similarity:
    similarity = str(settings.get("similarity_fn_name") or default)
    if similarity not in SIMILARITY_FUNCTIONS:
        raise MetadataError(f"similarity_fn_name {similarity!r} is not one of {', '.join(SIMILARITY_FUNCTIONS)}")
    return cast(Similarity, similarity)


def read_heads(
    folder: Path, modules: list[dict[str, Any]], works_on: str = SENTENCE_EMBEDDING
) -> tuple[tuple[Head, ...], bool]:
    """The modules after pooling (or, with `works_on` token_embeddings, after a MultiVectorEncoder's
    Transformer), and whether the last is a Normalize (then left out: it is the model's own normalization,
    which a request may turn off)."""
    heads = [head for module in modules if (head := read_head(folder, module, works_on)) is not None]
    normalize = bool(heads) and isinstance(heads[-1], NormalizeHead)
    if normalize:
        heads.pop()
    return tuple(heads), normalize


def module_class(module: dict[str, Any]) -> str:
    """The class name of a sentence-transformers module ("" for anyone else's)."""
    kind = str(module.get("type", ""))
    return kind.rsplit(".", 1)[-1] if kind.startswith(ST_PACKAGE) else ""


def describe(module: dict[str, Any]) -> str:
    return f"module {module.get('path') or module.get('name') or module.get('idx')!s} ({module.get('type')})"


def read_transformer_config(folder: Path, model_type: str) -> dict[str, Any]:
    path = folder / "sentence_bert_config.json"
    config: dict[str, Any] = read_json(path) if path.is_file() else {}
    for key, value in config.items():
        if key in ARGUMENT_DICTS:
            unknown = sorted(set(value or {}) - HARMLESS_ARGUMENTS)
            if unknown:
                raise MetadataError(f"sentence_bert_config.json sets {key} {unknown}, which poolserve does not apply")
        elif key == "backend":
            if value != "torch":
                raise MetadataError(f"sentence_bert_config.json asks for the {value!r} backend; poolserve runs torch")
        elif key in MULTI_VECTOR_KEYS and model_type == MULTI_VECTOR_ENCODER:
            continue
        elif key not in TRANSFORMER_KEYS:
            raise MetadataError(f"sentence_bert_config.json sets {key!r}, which poolserve does not apply")
    task = config.get("transformer_task")
    is_llm_reranker = model_type == CROSS_ENCODER and task == LLM_RERANKER_TASK
    if task is not None and task != TRANSFORMER_TASKS[model_type] and not is_llm_reranker:
        refusal = TASK_REFUSALS.get(task, f"a Transformer with transformer_task {task!r} is not supported")
        raise MetadataError(refusal)
    modalities = config.get("modality_config")
    # A CrossEncoder may render its pairs through the chat template as flat messages (apiserver/pair_template.py).
    renders_pairs = model_type == CROSS_ENCODER and (modalities or {}).get("message", {}).get("format") == "flat"
    if (
        modalities is not None
        and set(modalities) != {"text"}
        and not (renders_pairs and set(modalities) == {"text", "message"})
    ):
        raise MetadataError(f"a Transformer reading {sorted(modalities)} (modality_config) is not supported")
    return config


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


def read_pooling(folder: Path) -> tuple[tuple[str, ...], int | None]:
    """Pooling modes (sentence-transformers' names, its concatenation order kept) and the token width."""
    config: dict[str, Any] = read_json(folder / "config.json")
    if config.get("include_prompt") is False:
        raise MetadataError("Pooling with include_prompt false (the prompt's tokens left out) is not supported yet")
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
    return modes, int(dimension) if dimension else None


def read_head(folder: Path, module: dict[str, Any], works_on: str = SENTENCE_EMBEDDING) -> Head | None:
    """A module after Pooling; None for one that does nothing at inference (Dropout)."""
    name = module_class(module)
    path = folder / str(module.get("path", ""))
    if name == "Dense":
        config: dict[str, Any] = read_json(path / "config.json")
        check_keys(
            config, {"in_features", "out_features", "bias", "activation_function", "use_residual"}, module, works_on
        )
        return DenseHead(
            path,
            int(config["in_features"]),
            int(config["out_features"]),
            bool(config.get("bias", True)),
            str(config.get("activation_function") or DEFAULT_DENSE_ACTIVATION),
            bool(config.get("use_residual", False)),
        )
    if name == "LayerNorm":
        config = read_json(path / "config.json")
        check_keys(config, {"dimension"}, module, works_on)
        return LayerNormHead(path, int(config["dimension"]))
    if name == "Normalize":
        config_path = path / "config.json"
        if path != folder and config_path.is_file():
            check_keys(read_json(config_path), set(), module, works_on)
        return NormalizeHead()
    if name == "Dropout":
        return None
    place = "after Pooling" if works_on == SENTENCE_EMBEDDING else "in a MultiVectorEncoder"
    raise MetadataError(f"the {describe(module)} is not supported {place}")


def check_keys(config: dict[str, Any], known: set[str], module: dict[str, Any], works_on: str) -> None:
    """A module reads `works_on` (the pooled sentence embedding, or a MultiVectorEncoder's token vectors) and
    writes it back; any other key is an option poolserve lacks."""
    for key in ("module_input_name", "module_output_name"):
        value = config.get(key)
        # An unnamed Dense input is token_embeddings in a MultiVectorEncoder (PyLate's and older saves name none).
        if (
            works_on == TOKEN_EMBEDDINGS
            and value != TOKEN_EMBEDDINGS
            and not (value is None and "in_features" in known)
        ):
            raise MetadataError(
                f"the {describe(module)} works on {value!r}; a MultiVectorEncoder's modules work on "
                f"{TOKEN_EMBEDDINGS!r}, the only kind poolserve runs there"
            )
        if works_on == SENTENCE_EMBEDDING and value not in (None, SENTENCE_EMBEDDING):
            raise MetadataError(
                f"the {describe(module)} works on {value!r} (per-token vectors, as ColBERT's do); poolserve's heads "
                "work on the pooled sentence embedding"
            )
    unknown = sorted(set(config) - known - {"module_input_name", "module_output_name"})
    if unknown:
        raise MetadataError(f"the {describe(module)} sets {unknown}, which poolserve does not apply")


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
