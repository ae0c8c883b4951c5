"""`--runtime onnxruntime`: an embedding model's transformer exported to ONNX once, optimised once, cached on disk,
and run by ONNX Runtime in place of torch's forward pass; pooling and heads stay poolserve's own (torch).

Why (docs/benchmarks.md, issue 33): on a CPU at float32, ONNX Runtime's fused graph (attention, LayerNorm and GELU
each one kernel: `onnxruntime.transformers.optimizer`, as optimum optimises it for Infinity) answers a sentence
faster than torch's eager modules. The graph is exported from the very weights the engine loaded, and the engine
compares its vectors with torch float32's on the probe set before it serves (engine_core/loader.py).
"""

from __future__ import annotations

import fcntl
import hashlib
import inspect
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Iterable
from importlib.metadata import version
from pathlib import Path
from typing import Any

import numpy as np
import torch
from transformers.modeling_outputs import BaseModelOutput

from engine_core.packed_graph import (
    BLOCK_MASK,
    PACKED_NAME,
    WEIGHTS_NAME,
    pack_rows,
    packed_feed,
    packed_graph,
    unpacked,
)

logger = logging.getLogger(__name__)

# Bump when the export or the optimisation changes, so that graphs cached by an older poolserve are not reused.
GRAPH_FORMAT = 2
OPSET = 17
# The files whose bytes decide the graph: the architecture and the weights (not the tokenizer's).
GRAPH_FILES = ("config.json", "*.safetensors", "*.bin")
LIBRARIES = ("torch", "transformers", "onnx", "onnxruntime")
# float32 noise: a fused graph reorders sums, so its vectors move in the 7th digit, never further.
MIN_COSINE = 0.99999
INPUT_NAMES = ("input_ids", "attention_mask", "token_type_ids")
# The name of an export's work directory beside the cached graph, until it is renamed into place.
EXPORT_PREFIX = "export-"


def default_cache_dir() -> Path:
    """Where graphs are cached when --onnx-cache-dir is empty: beside Hugging Face's, never in the model folder
    (which may be read-only or shared)."""
    return Path.home() / ".cache" / "poolserve" / "onnx"


def graph_files(folder: Path) -> list[Path]:
    found = {path for pattern in GRAPH_FILES for path in folder.glob(pattern) if path.is_file()}
    return sorted(found)


def file_digest(path: Path) -> str:
    with path.open("rb") as file:
        return hashlib.file_digest(file, "sha256").hexdigest()


def cache_key(files: Iterable[tuple[str, str]], libraries: dict[str, str], model_class: str) -> str:
    """The name of a cached graph: a hash of the files' names and contents' digests, the libraries' versions that
    export, optimise and run it, the class that was exported and the graph format. Any of them changing (new
    weights, a torch upgrade) makes a new graph rather than reusing one that may no longer be the model's."""
    digest = hashlib.sha256(f"format {GRAPH_FORMAT} opset {OPSET} class {model_class}\n".encode())
    for name, file_hash in sorted(files):
        digest.update(f"file {name} {file_hash}\n".encode())
    for name, installed in sorted(libraries.items()):
        digest.update(f"library {name} {installed}\n".encode())
    return digest.hexdigest()[:32]


def folder_key(folder: Path, model_class: str) -> str:
    files = [(path.name, file_digest(path)) for path in graph_files(folder)]
    return cache_key(files, {name: version(name) for name in LIBRARIES}, model_class)


class _LastHiddenState(torch.nn.Module):
    """What is exported: the encoder's last hidden states, from the inputs the runner gives it."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model

    def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
        named = dict(zip(INPUT_NAMES, inputs, strict=False))
        hidden: torch.Tensor = self.model(**named).last_hidden_state
        return hidden


def export_graph(model: torch.nn.Module, path: Path, *, uses_token_types: bool) -> None:
    """TorchScript export (its graph is the one ONNX Runtime's BERT fusions recognise), eager attention (the
    fusions match its MatMul/Softmax pattern, not SDPA's), batch and sequence dynamic."""
    names = list(INPUT_NAMES if uses_token_types else INPUT_NAMES[:2])
    example = [torch.ones((2, 8), dtype=torch.int64) for _ in names]
    # padding in the example, so that no branch of the model's mask code that skips an all-ones mask is traced
    example[1][1, 5:] = 0
    model_any: Any = model
    previous, was_training = model_any.config._attn_implementation, model.training
    model_any.set_attn_implementation("eager")
    try:
        # The exporter warns that TorchScript export is deprecated and that traced Python values are constants; the
        # graph is held to torch's vectors on the probe set instead, and the warnings would only flood the log.
        with torch.inference_mode(False), torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.onnx.export(
                _LastHiddenState(model),
                tuple(example),
                str(path),
                input_names=names,
                output_names=["last_hidden_state"],
                dynamic_axes={name: {0: "batch", 1: "sequence"} for name in [*names, "last_hidden_state"]},
                opset_version=OPSET,
                dynamo=False,
            )
    finally:
        model_any.set_attn_implementation(previous)
        # torch 2.13's TorchScript export leaves the module in training mode (dropout on): the engine's own model
        # must come back as it was, or the probe's torch reference is the one that strays.
        model.train(was_training)


def optimize_graph(source: Path, target: Path, *, num_heads: int, hidden_size: int) -> None:
    """ONNX Runtime's transformer optimiser, BERT fusions (attention, skip LayerNorm, bias GELU). GELU stays exact:
    its tanh approximation would move the vectors beyond float32 noise."""
    import onnxruntime.transformers
    from onnxruntime.transformers.fusion_options import FusionOptions
    from onnxruntime.transformers.optimizer import optimize_model

    # Its modules log each fusion at INFO under their bare names ("fusion_base", "onnx_model", ...): not the server's.
    for module in Path(onnxruntime.transformers.__file__).parent.glob("*.py"):
        logging.getLogger(module.stem).setLevel(logging.WARNING)
    options = FusionOptions("bert")
    options.enable_gelu_approximation = False
    optimized = optimize_model(
        str(source), model_type="bert", num_heads=num_heads, hidden_size=hidden_size, optimization_options=options
    )
    optimized.save_model_to_file(str(target))


def graph_target(folder: Path, model_class: str, cache_dir: Path) -> Path:
    """Where the packed graph of `model_class` loaded from `folder` is cached (present or not)."""
    return cache_dir / folder_key(folder, model_class) / PACKED_NAME


def cached_graph(model: torch.nn.Module, folder: Path, cache_dir: Path) -> Path:
    """The packed graph of `model` (loaded from `folder`; engine_core/packed_graph.py), exported, optimised and packed
    on the first start only. Made in a temporary folder beside it and renamed, so that engines starting together
    never read half a file; one exports at a time (a lock beside the graph), the others wait for its graph rather
    than export it again. Only the packed graph is kept: the optimised one it is made from would double the cache's
    disk (about the float32 weights' size: 87 MB for MiniLM)."""
    config: Any = model.config
    target = graph_target(folder, type(model).__name__, cache_dir)
    if target.is_file():
        logger.info("ONNX graph from the cache: %s", target)
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with (target.parent / "export.lock").open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if target.is_file():
            logger.info("ONNX graph from the cache, exported meanwhile: %s", target)
            return target
        uses_token_types = int(getattr(config, "type_vocab_size", 0) or 0) > 0 and "token_type_ids" in _forward_names(
            model
        )
        # An export's work left by an engine that stopped half way (only the lock's holder writes one)
        for stale in target.parent.glob(f"{EXPORT_PREFIX}*"):
            shutil.rmtree(stale, ignore_errors=True)
        with tempfile.TemporaryDirectory(dir=target.parent, prefix=EXPORT_PREFIX) as work:
            exported = Path(work) / "exported.onnx"
            export_graph(model, exported, uses_token_types=uses_token_types)
            optimized = Path(work) / "model.onnx"
            optimize_graph(
                exported, optimized, num_heads=int(config.num_attention_heads), hidden_size=int(config.hidden_size)
            )
            exported.unlink()  # the disk it takes at once: twice the weights, not three times
            packed = packed_graph(optimized)
            os.replace(packed.with_name(WEIGHTS_NAME), target.with_name(WEIGHTS_NAME))
            os.replace(packed, target)  # last: the graph's presence says both are whole
    logger.info("ONNX graph of %s exported, optimised and packed to %s", type(model).__name__, target)
    return target


def exporting_elsewhere(target: Path) -> bool:
    """Whether another process holds the export lock of the graph `target` (cached_graph's), checked without waiting:
    an engine that finds one waits for that graph rather than start an export of its own that would wait for it."""
    lock_path = target.parent / "export.lock"
    if not lock_path.is_file():
        return False
    with lock_path.open("a") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
    return False  # closing the file released it


def exported_graph(
    folder: Path, auto_class: str, model_class: str, cache_dir: Path, *, nice: int, target: Path | None = None
) -> Path:
    """The packed graph of the model `folder` holds (engine_core/packed_graph.py), from the cache, or exported,
    optimised and packed into it by a process of its own (engine_core/export_graph.py says why), at `nice`. `target`:
    its graph_target where the caller has it (the key hashes the weights)."""
    packed = target or graph_target(folder, model_class, cache_dir)
    if packed.is_file():
        logger.info("ONNX graph from the cache: %s", packed)
        return packed
    cache_dir.mkdir(parents=True, exist_ok=True)  # a cache that cannot be fails here, at once
    started = time.monotonic()
    if exporting_elsewhere(packed):
        logger.info("ONNX graph of %s: another process exports it; waiting for its graph", model_class)
        while exporting_elsewhere(packed) and not packed.is_file():
            time.sleep(1.0)
        if packed.is_file():
            logger.info("ONNX graph of %s exported meanwhile by another process: %s", model_class, packed)
            return packed
    command = [
        sys.executable, "-m", "engine_core.export_graph", str(folder), auto_class, str(cache_dir.absolute()),
        "--parent", str(os.getpid()), "--nice", str(nice),
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        said = [line for line in done.stderr.splitlines() if line.strip()]
        raise RuntimeError(said[-1] if said else f"its export exited with status {done.returncode}")
    graph = Path(done.stdout.split()[-1])
    logger.info("ONNX graph of %s exported, optimised and packed in %.1f s by a process of its own: %s", model_class,
                time.monotonic() - started, graph)  # fmt: skip
    return graph


def _forward_names(model: torch.nn.Module) -> set[str]:
    return set(inspect.signature(model.forward).parameters)


class OnnxEncoder(torch.nn.Module):
    """ONNX Runtime sessions in the place of the encoder: called as the runner calls the model (input ids, attention
    mask, token types), they answer the last hidden states as a torch tensor over ONNX Runtime's array.

    A graph with a block mask (engine_core/packed_graph.py, as the engine loads it) is given the batch laid end to end
    in rows and its answer is laid back on the padded batch's places; any other graph, the padded batch itself.

    Two sessions over one graph when the engine has several threads (`small_session`): a pass runs on the one of as
    many threads as engine_core/threads.py gives torch for it (one for a small batch with work queued behind it, for
    each of two passes at once, which then run side by side on the one session, and for each of two clients' lone
    sentences on the lanes; all of them for a large one or a lone request; ONNX Runtime fixes a session's threads when
    it is made). Each repacks the weights of its products; the rest it maps from the cached graph's weights file
    (engine_core/packed_graph.py), shared. Without it, one session of every thread (the benches' trials). `spin`:
    whether a session's threads go on spin-waiting once a pass is done (ONNX Runtime's default), which costs the next
    pass its cores when torch runs it, and the API servers theirs (the engine's do not). Within a pass they spin either
    way: a sleeping thread's wake-up between one operator's parallel work and the next cost a lone sentence 8-17 % of
    its pass (docs/benchmarks.md, "Spinning within a pass")."""

    def __init__(self, path: Path, threads: int, *, small_session: bool = True, spin: bool = True):
        super().__init__()
        self.path = path
        self.full = new_session(path, threads, spin=spin)
        self.small = new_session(path, 1, spin=spin) if threads > 1 and small_session else self.full
        self.input_names = [node.name for node in self.small.get_inputs()]
        self.packed = BLOCK_MASK in self.input_names  # engine_core/packed_graph.py's graph

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, token_type_ids: torch.Tensor | None = None
    ) -> BaseModelOutput:
        session = self.full if torch.get_num_threads() > 1 else self.small
        ids, types = input_ids.numpy(), None if token_type_ids is None else token_type_ids.numpy()
        if self.packed:  # a right-padded batch, as the runner gives it, laid end to end in rows
            rows = pack_rows(attention_mask.numpy().sum(axis=1))
            packed_inputs = packed_feed(rows, ids, types)
            (states,) = session.run(["last_hidden_state"], {name: packed_inputs[name] for name in self.input_names})
            return BaseModelOutput(last_hidden_state=torch.from_numpy(unpacked(rows, states, ids.shape[1])))
        given = {"input_ids": ids, "attention_mask": attention_mask.numpy(), "token_type_ids": types}
        # a model with segments given none (an embedder's single texts): segment 0, as torch defaults it
        feed = {name: np.zeros_like(ids) if given[name] is None else given[name] for name in self.input_names}
        (hidden,) = session.run(["last_hidden_state"], feed)
        return BaseModelOutput(last_hidden_state=torch.from_numpy(hidden))


def new_session(path: Path, threads: int, *, spin: bool = True) -> Any:
    import onnxruntime

    options = onnxruntime.SessionOptions()
    if not spin:  # the threads stop spinning as the last run on the session returns (they spin again with the next)
        options.add_session_config_entry("session.force_spinning_stop", "1")
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.execution_mode = onnxruntime.ExecutionMode.ORT_SEQUENTIAL
    options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_ENABLE_ALL
    return onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
