"""The engine's CUDA path: page-locked host staging, asynchronous copies, float16 by default. Run wherever
torch reports CUDA (skipped elsewhere): the CPU build of torch cannot take these paths."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from tokenizers import Tokenizer

from bench.harness.corpus import make_sentence
from engine_core.load_model import load_model
from engine_core.loader import LoadedModel
from engine_core.runner import to_device
from poolserve.config import Config
from tests.sentences import SENTENCES

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@pytest.fixture(scope="module")
def cpu_fp32() -> LoadedModel:
    return load_model(Config(device="cpu", dtype="float32"))


def corpus_rows(loaded: LoadedModel) -> list[np.ndarray]:
    """The test sentences and 256 of the bench corpus's (10-40 words each), as token ids."""
    backend = Tokenizer.from_str(loaded.card.tokenizer_json)
    rng = random.Random(0)
    texts = [*SENTENCES, *(make_sentence(rng) for _ in range(256))]
    return [np.asarray(backend.encode(text).ids[: loaded.card.max_model_len], dtype=np.int32) for text in texts]


def lowest_cosine(a: np.ndarray, b: np.ndarray) -> float:
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    return float(((a64 * b64).sum(1) / np.linalg.norm(a64, axis=1) / np.linalg.norm(b64, axis=1)).min())


def run_in_batches(loaded: LoadedModel, rows: list[np.ndarray], size: int = 32) -> np.ndarray:
    return np.concatenate([loaded.runner.run_texts(rows[i : i + size], None) for i in range(0, len(rows), size)])


def test_a_host_array_reaches_the_gpu_through_page_locked_memory_unchanged() -> None:
    array = np.arange(4096, dtype=np.int64).reshape(64, 64)
    on_gpu = to_device(array, torch.device("cuda"))
    assert on_gpu.device.type == "cuda"
    assert torch.equal(on_gpu.cpu(), torch.from_numpy(array))


def test_float32_on_cuda_equals_float32_on_cpu(cpu_fp32: LoadedModel) -> None:
    gpu = load_model(Config(device="cuda", dtype="float32"))
    rows = corpus_rows(cpu_fp32)
    assert lowest_cosine(run_in_batches(gpu, rows), run_in_batches(cpu_fp32, rows)) >= 0.99999


def test_auto_serves_float16_on_cuda_within_cosine_0_999_of_float32(cpu_fp32: LoadedModel) -> None:
    gpu = load_model(Config(device="cuda", dtype="auto"))
    assert gpu.card.dtype == "float16"
    rows = corpus_rows(cpu_fp32)
    assert lowest_cosine(run_in_batches(gpu, rows), run_in_batches(cpu_fp32, rows)) >= 0.999
