"""What a model folder and the flags decide before any weights load: the kind of model, its pooling, prompts,
maximum length, activation and precision, and what is refused (LoadError: one sentence for the operator)."""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any, NamedTuple

import torch
from tokenizers import Tokenizer, normalizers
from transformers import PretrainedConfig, PreTrainedTokenizerBase

from engine_core.pooling import FLAG_MODES
from engine_core.pylate_folder import is_pylate_folder, read_pylate_folder
from engine_core.st_folder import read_st_folder
from engine_core.st_modules import CROSS_ENCODER, MetadataError, StFolder
from poolserve.config import Config
from poolserve.model_card import (
    CLASSIFIER,
    CLIP,
    EMBEDDING,
    SPARSE,
    TASK_CLASSIFY,
    TASK_EMBED,
    TASK_EMBED_SPARSE,
    TASK_POOL,
    TASK_SCORE,
    TASK_TOKEN_EMBED,
    TASK_TOKENIZE,
    Activation,
    ModelCard,
    ModelKind,
    Task,
    TextTemplate,
)

# Text and image towers projected into one space, served as CLIP is: CLIP, and SigLIP (SigLIP 1, and SigLIP 2's
# fixed-resolution checkpoints, which are saved as SigLIP).
IMAGE_TEXT_MODEL_TYPES = {"clip", "siglip"}
SIGLIP2_NAFLEX = (
    "siglip2 (SigLIP 2 NaFlex, whose Siglip2ImageProcessor resizes each image to a patch grid of its own aspect "
    "ratio and masks the patches it pads) is not served, as poolserve sends every image of a model at one size; "
    "SigLIP 2's fixed-resolution checkpoints (model_type siglip) are."
)
SIGLIP_SENTENCEPIECE = (
    "SiglipTokenizer (SigLIP's SentencePiece tokenizer, which lowercases and strips punctuation before it splits) "
    "has no fast tokenizer (tokenizer.json) that tokenizes as it does, and the API servers run only fast tokenizers; "
    "a SigLIP folder whose tokenizer is fast (SigLIP 2's fixed-resolution checkpoints) is served."
)
DECODER_MODEL_TYPES = {"gpt2", "llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "gemma3", "phi3"}


class LoadError(RuntimeError):
    """The model cannot be served as configured; the message is one sentence for the operator."""


def not_exact(folder: Path, exc: MetadataError) -> LoadError:
    """What the folder asks for that poolserve cannot run exactly, as the operator reads it."""
    return LoadError(f"{folder} cannot be served exactly: {exc}.")


def read_folder(folder: Path) -> StFolder:
    try:
        if is_pylate_folder(folder):
            return read_pylate_folder(folder)
        return read_st_folder(folder)
    except MetadataError as exc:
        raise not_exact(folder, exc) from exc
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise LoadError(f"cannot read the Sentence-Transformers files in {folder}: {first_line(exc)}") from exc


def model_kind(model_config: PretrainedConfig, st: StFolder, llm_reranker: bool = False) -> ModelKind:
    """What the folder is served as. Sentence-Transformers files decide where there are some: an embedder's
    modules run the base model whatever head its checkpoint also holds, and a CrossEncoder is a classifier.
    A language model scored from its logits (`llm_reranker`: engine_core/pair_scoring.py) is a classifier too."""
    if llm_reranker:
        return CLASSIFIER
    if model_config.model_type in IMAGE_TEXT_MODEL_TYPES:
        if not getattr(model_config.vision_config, "vision_use_head", True):
            raise LoadError("this SigLIP's vision tower has no pooling head (vision_use_head is false), so it gives "
                            "no image embedding.")  # fmt: skip
        return CLIP
    if model_config.model_type == "siglip2":
        raise LoadError(SIGLIP2_NAFLEX)
    is_classifier = any(arch.endswith("ForSequenceClassification") for arch in (model_config.architectures or []))
    if st.splade is not None:
        return SPARSE
    if st.has_modules:
        if st.model_type == CROSS_ENCODER and not is_classifier:
            raise LoadError(
                "this CrossEncoder's model is not a sequence classifier (its config names no "
                "*ForSequenceClassification architecture), so it has no trained scoring head."
            )
        return CLASSIFIER if st.model_type == CROSS_ENCODER else EMBEDDING
    return CLASSIFIER if is_classifier else EMBEDDING


def auto_class_name(kind: ModelKind, llm_reranker: bool = False) -> str:
    """The transformers Auto class whose model the engine runs."""
    if llm_reranker:
        return "AutoModelForCausalLM"
    return {CLASSIFIER: "AutoModelForSequenceClassification", SPARSE: "AutoModelForMaskedLM"}.get(kind, "AutoModel")


def check_siglip_tokenizer(folder: Path, model_config: PretrainedConfig) -> None:
    """A SigLIP folder whose tokenizer is SigLIP's own (the class its tokenizer_config.json names, else the one
    transformers picks for model_type siglip) is refused before transformers tries to load it."""
    if model_config.model_type != "siglip":
        return
    path = folder / "tokenizer_config.json"
    declared = json.loads(path.read_text()).get("tokenizer_class") if path.is_file() else None
    if str(declared or "SiglipTokenizer").removesuffix("Fast") == "SiglipTokenizer":
        raise LoadError(SIGLIP_SENTENCEPIECE)


class TextPadding(NamedTuple):
    """How an image-text model's texts are padded: to `width` tokens (0: the batch's longest), on the left or the
    right, the text tower given the attention mask or not."""

    width: int = 0
    left: bool = False
    masked: bool = True


def image_text_padding(model_config: PretrainedConfig, tokenizer: PreTrainedTokenizerBase) -> TextPadding:
    """SigLIP was trained on texts padded to its maximum length and its text tower reads the last position, padding
    or not, so its texts are padded as its card pads them (`padding="max_length"`: to the tokenizer's maximum within
    the text tower's positions, whatever --max-model-len, on the tokenizer's padding side), the mask given to the
    model only if the tokenizer returns one (a tokenizer whose model_input_names lack it has the padding attended).
    CLIP's texts are padded to the longest of a batch."""
    if model_config.model_type != "siglip":
        return TextPadding()
    return TextPadding(
        width=choose_max_model_len(0, tokenizer.model_max_length, model_config, None),
        left=tokenizer.padding_side == "left",
        masked="attention_mask" in tokenizer.model_input_names,
    )


def vision_tokens(model_config: PretrainedConfig) -> int:
    """What one image costs in the token budget: its patches, and CLIP's class token (SigLIP has none)."""
    vision = model_config.vision_config
    patches = (int(vision.image_size) // int(vision.patch_size)) ** 2
    return patches + 1 if model_config.model_type == "clip" else patches


def text_config_of(model_config: PretrainedConfig) -> PretrainedConfig:
    """The config of the text tower (CLIP keeps it apart), else the config itself."""
    return getattr(model_config, "text_config", None) or model_config


def is_causal_lm(model_config: PretrainedConfig) -> bool:
    return any(arch.endswith("ForCausalLM") for arch in (model_config.architectures or []))


def choose_pooling(requested: str, st: StFolder, model_config: PretrainedConfig) -> tuple[str, ...]:
    """Sentence-Transformers' pooling modes: --pooling when given, else the folder's Pooling module, else
    last-token for decoder models and mean for encoders."""
    if requested != "auto":
        if not st.pooling_includes_prompt:
            raise LoadError(
                f"--pooling {requested} replaces the folder's Pooling, which leaves the prompt's tokens out "
                "(include_prompt false); drop --pooling."
            )
        if st.heads and st.pooling != (FLAG_MODES[requested],):
            raise LoadError(
                f"--pooling {requested} replaces the folder's Pooling ({'+'.join(st.pooling)}), whose output its "
                "Dense or LayerNorm modules read; drop --pooling."
            )
        return (FLAG_MODES[requested],)
    if st.pooling:
        hidden = getattr(text_config_of(model_config), "hidden_size", None)
        if st.embedding_dimension and hidden and st.embedding_dimension != hidden:
            raise LoadError(
                f"the Pooling module expects token vectors of {st.embedding_dimension} values but the model gives "
                f"{hidden}."
            )
        return st.pooling
    if is_causal_lm(model_config):
        # A language model with no word on how to embed: most likely an LLM reranker (Qwen3-Reranker's
        # layout), whose score comes from its logits. Served as an embedder it would answer plausible nonsense.
        raise LoadError(
            f"{(model_config.architectures or ['?'])[0]} is a causal language model with no Sentence-Transformers "
            "files saying how to use it: to serve it as a reranker scored from its logits, give --score-tokens (and "
            "--score-template unless its chat template renders query/document pairs), or --score-format for "
            "mxbai-rerank-v2 or bge-reranker-v2-gemma; as an embedder, --pooling last (or mean)."
        )
    is_decoder = model_config.model_type in DECODER_MODEL_TYPES
    return ("lasttoken",) if is_decoder else ("mean",)


def classifier_activation(model_config: PretrainedConfig, st: StFolder, num_labels: int) -> Activation:
    """The activation a classifier's scores get: the Sentence-Transformers CrossEncoder's own choice when
    its files record one (config_sentence_transformers.json since version 5, config.json before), else
    sigmoid for one label or multi-label problems, softmax otherwise."""
    st_config = getattr(model_config, "sentence_transformers", None)
    named = st.activation_fn or (str(st_config.get("activation_fn", "")) if isinstance(st_config, dict) else "")
    markers: tuple[tuple[str, Activation], ...] = (("Identity", "none"), ("Sigmoid", "sigmoid"), ("Softmax", "softmax"))
    for marker, activation in markers:
        if marker in named:
            return activation
    if named:
        raise LoadError(f"the CrossEncoder's activation_fn {named!r} is not one poolserve applies (Identity, "
                        "Sigmoid, Softmax).")  # fmt: skip
    if num_labels == 1 or model_config.problem_type == "multi_label_classification":
        return "sigmoid"
    return "softmax"


def tasks_of(kind: ModelKind, num_labels: int, renders_pairs: bool = False) -> list[Task]:
    if renders_pairs:  # a reranker reading pairs through its template: a single text is nothing it scores
        return [TASK_SCORE, TASK_POOL, TASK_TOKENIZE]
    if kind == CLASSIFIER:
        # A one-label classifier is a cross-encoder: it scores pairs.
        return (
            [TASK_CLASSIFY, TASK_SCORE, TASK_POOL, TASK_TOKENIZE]
            if num_labels == 1
            else [
                TASK_CLASSIFY,
                TASK_POOL,
                TASK_TOKENIZE,
            ]
        )
    if kind == EMBEDDING:  # an AutoModel's token states: per-token output too (CLIP's towers give none)
        return [TASK_EMBED, TASK_SCORE, TASK_POOL, TASK_TOKENIZE, TASK_TOKEN_EMBED]
    if kind == SPARSE:  # sparse vectors only: no dense embedding (docs/api.md, "Sparse models")
        return [TASK_EMBED_SPARSE, TASK_SCORE, TASK_POOL, TASK_TOKENIZE]
    return [TASK_EMBED, TASK_SCORE, TASK_POOL, TASK_TOKENIZE]


def choose_max_model_len(requested: int, tokenizer_max: int, model_config: PretrainedConfig, st_max: int | None) -> int:
    """--max-model-len, else Sentence-Transformers' max_seq_length, else the tokenizer's, each within the
    model's positions. sentence-transformers hands max_seq_length to the tokenizer in place of its own
    model_max_length, so a folder's max_seq_length may be longer than the tokenizer's."""
    positions = getattr(text_config_of(model_config), "max_position_embeddings", None)
    limits = [int(n) for n in (st_max or tokenizer_max, positions) if n and 0 < int(n) < 10_000_000]
    if not limits:
        raise LoadError("the model states no maximum length; set --max-model-len.")
    model_limit = min(limits)
    if requested:
        if requested > model_limit:
            raise LoadError(f"--max-model-len {requested} exceeds the model's maximum of {model_limit} tokens.")
        return requested
    return model_limit


def check_long_input_overlap(config: Config, card: ModelCard) -> None:
    """--long-input-overlap must leave each window of a chunked input a token the one before did not hold
    (apiserver/requests/inputs/windows.py): said at start rather than to every client whose input is long."""
    if not config.long_input_overlap:
        return
    room = card.max_model_len - Tokenizer.from_str(card.tokenizer_json).num_special_tokens_to_add(is_pair=False)
    if config.long_input_overlap >= room:
        raise LoadError(
            f"--long-input-overlap {config.long_input_overlap} repeats a whole window: this model's windows hold "
            f"{room} text tokens; give fewer."
        )


def choose_prompts(config: Config, st: StFolder, kind: ModelKind) -> tuple[dict[str, str], str]:
    """The model's prompts by name, and the text put before every text that names none: --default-prompt,
    else the prompt --default-prompt-name names, else the folder's default_prompt_name (as sentence-transformers
    applies it; TEI applies none unless told by flag)."""
    if (config.default_prompt or config.default_prompt_name) and kind not in (EMBEDDING, SPARSE):
        raise LoadError("--default-prompt and --default-prompt-name apply to embedding models; this is a "
                        f"{kind} model.")  # fmt: skip
    prompts = st.prompts
    if not st.has_modules and kind in (EMBEDDING, SPARSE):
        # sentence-transformers gives a folder without its files the query and document prompts every
        # SentenceTransformer has: empty, so encode_query uses none rather than a default prompt.
        prompts = {"query": "", "document": "", **prompts}
    if config.default_prompt:
        return prompts, config.default_prompt
    name = config.default_prompt_name or st.default_prompt_name
    if name and name not in prompts:
        known = ", ".join(sorted(prompts)) or "none"
        raise LoadError(f"--default-prompt-name {name!r} is not one of the model's prompts ({known}).")
    return prompts, prompts[name] if name else ""


def measure_prompt_lengths(
    prompts: Iterable[str], backend: Tokenizer, special_ids: Iterable[int], max_model_len: int
) -> dict[str, int]:
    """Each prompt's length as sentence-transformers measures it for a Pooling that leaves the prompt out
    (Transformer._get_prompt_length): the prompt tokenized alone (special tokens added, cut at the maximum), less
    its last token where that is a special one (a trailing [SEP] or EOS, which follows the text instead)."""
    special = set(special_ids)
    lengths: dict[str, int] = {}
    for prompt in prompts:
        if prompt and prompt not in lengths:
            ids = backend.encode(prompt).ids[:max_model_len]
            lengths[prompt] = len(ids) - int(bool(ids) and ids[-1] in special)
    return lengths


# sentence-transformers' message format by model type, where it knows it (base/modality.py), and the patterns that
# mark a template reading a message's content as a list of typed parts (InputFormatter._infer_format).
KNOWN_MESSAGE_FORMATS = {"apertus": "flat", "deepseek_v3": "flat", "gpt_oss": "flat", "seed_oss": "flat"}
STRUCTURED_PATTERNS = ("content[0]", ".type", "'type'", '"type"', "item.type", "message.content[")


def read_text_template(
    tokenizer: PreTrainedTokenizerBase, model_config: PretrainedConfig, st: StFolder
) -> TextTemplate | None:
    """The chat template sentence-transformers 6 renders an embedder's texts through: for a folder without its files
    the tokenizer's, whenever it has one (Transformer.infer_modalities adds the "message" modality, which preprocess
    then always uses for text), its message format inferred as sentence-transformers infers it; for a folder whose
    Transformer saves the "message" modality, the tokenizer's, in the format saved. Whether it reads a `task`, as
    sentence-transformers asks. None where texts are not rendered."""
    if st.has_modules and not st.renders_messages:
        return None
    if getattr(tokenizer, "chat_template", None) is None:
        if st.has_modules:
            raise LoadError("the Transformer reads the 'message' modality but its tokenizer has no chat template.")
        return None
    try:
        source = str(tokenizer.get_chat_template())
    except ValueError as exc:  # named templates with none called "default"
        raise LoadError(f"the tokenizer's chat template cannot be chosen: {first_line(exc)}") from exc
    saved = tokenizer.chat_template  # a template, or named ones
    known = st.message_format or KNOWN_MESSAGE_FORMATS.get(str(model_config.model_type))
    if known:
        structured = known == "structured"
    else:  # named templates, which sentence-transformers does not inspect, are read as structured
        structured = not isinstance(saved, str) or any(pattern in saved for pattern in STRUCTURED_PATTERNS)
    templates = saved.values() if isinstance(saved, dict) else [saved]
    takes_task = any(isinstance(t, str) and "task" in template_variables(t) for t in templates)
    return TextTemplate(source=source, structured=structured, takes_task=takes_task)


def template_variables(source: str) -> frozenset[str]:
    """The variables a template reads, found as transformers finds them (sentence-transformers asks it)."""
    from transformers.utils.chat_template_utils import _get_template_variables

    variables: frozenset[str] = _get_template_variables(source)
    return variables


def lowercase_first(backend: Tokenizer) -> None:
    """Sentence-Transformers' do_lower_case: a Lowercase normalizer put first, unless one is there already."""
    normalizer = backend.normalizer
    # A Sequence iterates over its normalizers at run time; the stubs do not say so.
    present: list[normalizers.Normalizer] = (
        [normalizer[i] for i in range(len(normalizer))] if isinstance(normalizer, normalizers.Sequence)
        else [] if normalizer is None else [normalizer]
    )  # fmt: skip
    if any(isinstance(n, normalizers.Lowercase) for n in present):
        return
    chain: list[normalizers.Normalizer] = [normalizers.Lowercase(), *present]
    backend.normalizer = normalizers.Sequence(chain)


def trained_dtype(model_config: PretrainedConfig) -> torch.dtype | None:
    """The dtype the config says the weights were saved in (transformers 5's `dtype`, 4's `torch_dtype`)."""
    value = getattr(model_config, "dtype", None) or getattr(model_config, "torch_dtype", None)
    if isinstance(value, str):
        value = getattr(torch, value.removeprefix("torch."), None)
    return value if isinstance(value, torch.dtype) else None


def select_dtype(requested: str, device: torch.device, model_config: PretrainedConfig) -> torch.dtype:
    if requested == "int8":
        if device.type != "cpu":
            raise LoadError(f"--dtype int8 is a CPU mode; this engine runs on {device.type} (use --dtype auto there).")
        if not torch.backends.mkldnn.is_available():  # type: ignore[no-untyped-call]
            raise LoadError("--dtype int8 runs oneDNN's int8 product, which this torch build lacks; use --dtype auto.")
        # The weights int8 is made from, once the probe has measured them (engine_core/int8_linear.py).
        return torch.float32
    if requested == "auto":
        if device.type != "cuda":
            return torch.float32  # until load_model has measured bf16 (engine_core/cpu_precision.py)
        # A model trained in bfloat16 can overflow float16's range (Qwen3-Embedding-8B and Gemma 3 are
        # reported to): it keeps bfloat16, or float32 on a GPU without it. Others run in float16.
        if trained_dtype(model_config) == torch.bfloat16:
            return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float32
        return torch.float16
    return {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}[requested]


def first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def served_tokenizer(tokenizer: Any, do_lower_case: bool = False) -> Tokenizer:
    """A fast tokenizer's backend as the API servers run it: its own padding and truncation off (the engine pads,
    the API servers cut), lowercasing first where the Transformer module asks for it."""
    backend: Tokenizer = tokenizer.backend_tokenizer
    backend.no_padding()
    backend.no_truncation()
    if do_lower_case:
        lowercase_first(backend)
    return backend


def pad_token_id_of(tokenizer: Any, model_config: Any) -> int:
    """The tokenizer's pad id, else the config's, else 0."""
    pad_token_id = tokenizer.pad_token_id
    if pad_token_id is None:
        pad_token_id = getattr(model_config, "pad_token_id", None) or 0
    return int(pad_token_id)
