"""What one Sentence-Transformers module's files say, shared by the readers of every model type: the Transformer's
options, the heads (Dense, LayerNorm, Normalize), and the description of a folder they all fill in (StFolder).

Whatever poolserve cannot run exactly as sentence-transformers would is refused by name, in one sentence
(MetadataError): a module, an option, a value. engine_core/st_folder.py reads a folder with these.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from poolserve.model_card import Similarity

ST_PACKAGE = "sentence_transformers."
# The model types poolserve serves: an embedder, a cross-encoder (a sequence classifier), a sparse encoder, and a
# late-interaction (ColBERT) model.
SENTENCE_TRANSFORMER = "SentenceTransformer"
CROSS_ENCODER = "CrossEncoder"
SPARSE_ENCODER = "SparseEncoder"
MULTI_VECTOR_ENCODER = "MultiVectorEncoder"
SENTENCE_EMBEDDING = "sentence_embedding"
TOKEN_EMBEDDINGS = "token_embeddings"
# A Transformer's options that only a MultiVectorEncoder reads (its queries' and documents' lengths, query expansion).
MULTI_VECTOR_KEYS = {"query_length", "document_length", "query_expansion"}
DEFAULT_DENSE_ACTIVATION = "torch.nn.modules.activation.Tanh"  # Dense's default when its config names none

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
# How a Transformer reading the "message" modality lays out a message's content: the text itself, or typed parts.
MESSAGE_FORMATS = ("flat", "structured")
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
class RouterFolder:
    """sentence-transformers' Router (Asym before 5): queries and documents take separate module chains, each read
    as a SentenceTransformer's (a Transformer, a Pooling, heads; the modules after the Router included), and a text
    with neither role takes the chain of `default` ("query" or "document"), as the Router resolves its routes."""

    query: StFolder
    document: StFolder
    default: str
    # The Router's own names of the query's and the document's routes (named in messages).
    names: tuple[str, str] = ("query", "document")


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
    # Pooling's include_prompt: False when the prompt's tokens are left out of pooling (INSTRUCTOR's).
    pooling_includes_prompt: bool = True
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
    # None when unsaid (files saved before sentence-transformers 6: text only). The messages' format, where saved.
    renders_messages: bool | None = None
    message_format: str = ""
    # A SparseEncoder's pooling (None for any other folder), and the most non-zero values it keeps per row.
    splade: SpladeOptions | None = None
    max_active_dims: int | None = None
    # A MultiVectorEncoder (ColBERT): its heads and normalization work on every token's vector.
    late_interaction: LateInteractionFolder | None = None
    # Markers a legacy ColBERT checkpoint (PyLate's, Stanford's) inserted as tokens of their own, which
    # sentence-transformers registers as special tokens (engine_core/multi_vector.py).
    legacy_prefixes: tuple[str, ...] = ()
    # A Router: the query's and the document's chains (this folder's own Transformer and pooling fields unset, except
    # an inference-free SPLADE's, which are its document chain's).
    router: RouterFolder | None = None
    # An inference-free SPLADE's query chain: a SparseStaticEmbedding's folder (its tokenizer and per-token weights).
    sparse_static_folder: Path | None = None


def read_json(path: Path) -> Any:
    with path.open(encoding="utf-8") as f:
        return json.load(f)


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
    message_format = (modalities or {}).get("message", {}).get("format")
    # A CrossEncoder may render its pairs through the chat template as flat messages
    # (apiserver/requests/pair_template.py); a SentenceTransformer its texts, as flat or structured messages
    # (apiserver/requests/text_template.py).
    renders = (model_type == CROSS_ENCODER and message_format == "flat") or (
        model_type == SENTENCE_TRANSFORMER and message_format in MESSAGE_FORMATS
    )
    if (
        modalities is not None
        and set(modalities) != {"text"}
        and not (renders and set(modalities) == {"text", "message"})
    ):
        raise MetadataError(f"a Transformer reading {sorted(modalities)} (modality_config) is not supported")
    return config


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
