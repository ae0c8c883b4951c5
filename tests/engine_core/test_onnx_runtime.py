"""--runtime onnxruntime's loading (engine_core/onnx_runtime.py, engine_core/loader.py's onnx_runner): the cache key
follows the weights, the libraries and the class; a graph that strays from torch float32 and a model ONNX is not
given are refused at start-up, each in one sentence. --runtime hybrid's small passes through that graph
(engine_core/small_passes.py)."""

from __future__ import annotations

import logging
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from transformers import RobertaConfig, RobertaModel

from bench.harness.models import TINY, save_with_tokenizer
from engine_core import loader
from engine_core.later_graph import LaterGraph
from engine_core.load_model import load_model
from engine_core.loader import LoadError
from engine_core.onnx_runtime import OnnxEncoder, cache_key, folder_key, graph_files, graph_target
from engine_core.packed_graph import WEIGHTS_NAME
from engine_core.small_passes import SmallPassRunner
from poolserve.config import Config, ConfigError, DType
from tests.fidelity.layouts import tiny_bert

LIBRARIES = {"torch": "2.13.0", "transformers": "5.24.0", "onnx": "1.23.2", "onnxruntime": "1.32.0"}
FILES = [("config.json", "c0"), ("model.safetensors", "w0")]
REPO = Path(__file__).resolve().parents[2]


def onnx_config(folder: Path, cache: Path) -> Config:
    return Config(model=str(folder), device="cpu", dtype="float32", runtime="onnxruntime", onnx_cache_dir=str(cache))


@dataclass(frozen=True)
class Exported:
    folder: Path
    cache: Path


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> Exported:
    """A tiny BERT and a cache that holds its graph: one export (a process of its own, engine_core/export_graph.py)
    for the tests that load a cached graph."""
    root = tmp_path_factory.mktemp("exported")
    folder, cache = tiny_bert(root / "model", 3), root / "cache"
    load_model(onnx_config(folder, cache))
    return Exported(folder, cache)


def test_cache_key_follows_the_weights_the_libraries_and_the_class() -> None:
    key = cache_key(FILES, LIBRARIES, "BertModel")
    assert key == cache_key(FILES[::-1], dict(reversed(LIBRARIES.items())), "BertModel")
    assert key != cache_key([("config.json", "c0"), ("model.safetensors", "w1")], LIBRARIES, "BertModel")
    assert key != cache_key([*FILES, ("model-2.safetensors", "w2")], LIBRARIES, "BertModel")
    assert key != cache_key(FILES, {**LIBRARIES, "onnxruntime": "1.33.0"}, "BertModel")
    assert key != cache_key(FILES, LIBRARIES, "RobertaModel")


def test_the_key_reads_the_config_and_the_weights_only(tmp_path: Path) -> None:
    for name in ("config.json", "model.safetensors", "tokenizer.json", "vocab.txt"):
        (tmp_path / name).write_bytes(b"0")
    (tmp_path / "onnx").mkdir()
    (tmp_path / "onnx" / "model.onnx").write_bytes(b"0")
    assert [path.name for path in graph_files(tmp_path)] == ["config.json", "model.safetensors"]
    key = folder_key(tmp_path, "BertModel")
    (tmp_path / "tokenizer.json").write_bytes(b"1")
    assert folder_key(tmp_path, "BertModel") == key
    (tmp_path / "model.safetensors").write_bytes(b"1")
    assert folder_key(tmp_path, "BertModel") != key


def test_a_start_on_a_cached_graph_hashes_the_weights_once(monkeypatch: pytest.MonkeyPatch, exported: Exported) -> None:
    """The cache's key hashes the weights (~1 s a GB): a start reads it once, not once per step that needs it."""
    import engine_core.onnx_runtime

    hashed: list[str] = []
    digest = engine_core.onnx_runtime.file_digest

    def counted(path: Path) -> str:
        hashed.append(path.name)
        return digest(path)

    monkeypatch.setattr(engine_core.onnx_runtime, "file_digest", counted)
    monkeypatch.setattr(loader, "has_avx512", lambda: False)  # the graph for every pass, whichever this host is
    config = Config(model=str(exported.folder), device="cpu", dtype="float32", onnx_cache_dir=str(exported.cache))
    loaded = load_model(config)
    assert isinstance(loaded.runner.model, OnnxEncoder)  # type: ignore[attr-defined]  # auto, on the cached graph
    assert sorted(hashed) == ["config.json", "model.safetensors"]


def test_a_cached_graph_that_strays_from_torch_is_refused(tmp_path: Path, exported: Exported) -> None:
    """A graph in the cache under this model's key that is not this model's (here another model's weights; a
    corrupted or hand-edited cache alike) is caught by the probe, not served."""
    served = tiny_bert(tmp_path / "served", 1)
    planted = tmp_path / "cache" / folder_key(served, "BertModel")
    shutil.copytree(next(exported.cache.glob("*/")), planted)
    with pytest.raises(LoadError, match=r"BertModel's ONNX graph strays from torch float32 on the probe set"):
        load_model(onnx_config(served, tmp_path / "cache"))


def test_a_classifier_is_refused_by_name(classifier_model: Path, tmp_path: Path) -> None:
    with pytest.raises(LoadError, match="serves single-vector embedding models on the CPU; this is a classifier"):
        load_model(onnx_config(classifier_model, tmp_path))
    assert not any(tmp_path.iterdir())  # refused before anything was exported


def test_onnxruntime_runs_float32_on_the_cpu_only() -> None:
    with pytest.raises(ConfigError, match="--runtime onnxruntime runs float32; --dtype has value 'auto'"):
        Config(runtime="onnxruntime")
    with pytest.raises(ConfigError, match="--runtime onnxruntime is a CPU mode"):
        Config(runtime="onnxruntime", dtype="float32", device="cuda")


def test_hybrid_runs_beside_float32_or_int8_on_the_cpu_only() -> None:
    with pytest.raises(ConfigError, match=r"--runtime hybrid runs its small passes in float32 .* 'auto'"):
        Config(runtime="hybrid")
    with pytest.raises(ConfigError, match="--runtime hybrid is a CPU mode"):
        Config(runtime="hybrid", dtype="float32", device="cuda")
    assert Config(runtime="hybrid", dtype="int8").runtime == "hybrid"


@pytest.fixture
def two_threads() -> Iterator[None]:
    """Two torch threads for the test, as the engine has on a 2-core host: an in-process test before it on the same
    worker may have left torch on one (the engine's thread plan sets torch's process-wide count)."""
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


def test_hybrid_runs_small_batches_through_the_graph_and_large_ones_through_torch(
    exported: Exported, two_threads: None
) -> None:
    """A batch of at most 128 padded tokens goes to ONNX Runtime (on the session of as many threads as the pass has:
    every engine thread, or one, a lane's), a larger one to torch's packed modules; both answer torch float32's
    vectors, and two clients' lone sentences run on the lanes, each through the one-thread session."""
    folder = exported.folder
    hybrid = load_model(Config(model=str(folder), device="cpu", dtype="float32", runtime="hybrid",
                               onnx_cache_dir=str(exported.cache)))  # fmt: skip
    reference = load_model(Config(model=str(folder), device="cpu", dtype="float32"))
    runner = hybrid.runner
    assert isinstance(runner, SmallPassRunner) and hybrid.packs_tokens and hybrid.passes_at_once == 2
    assert hybrid.pairs_on_lanes
    encoder = runner.small.model  # type: ignore[attr-defined]
    assert isinstance(encoder, OnnxEncoder) and encoder.small is not encoder.full
    assert config_entry(encoder.full, "session.force_spinning_stop") == "1"
    small = [np.arange(1000, 1000 + n, dtype=np.int32) for n in (10, 30, 60)]  # 3 x 60 = 180 padded tokens
    assert runner.runner_for(small[:2]) is runner.small  # 2 x 30 = 60
    assert runner.runner_for(small) is runner.large
    ran: list[object] = []
    for session in (encoder.full, encoder.small):
        run = session.run
        session.run = lambda *args, run=run, session=session: ran.append(session) or run(*args)  # type: ignore[method-assign]
    for threads in (2, 1):  # every engine thread, then a lane's one
        torch.set_num_threads(threads)
        assert runner.runner_for(small[:1]) is runner.small
        for rows in (small[:1], small[:2], small):
            assert agrees(runner.run_texts(rows, None), reference.runner.run_texts(rows, None))
    assert ran == [encoder.full, encoder.full, encoder.small, encoder.small]


def agrees(got: np.ndarray, want: np.ndarray) -> bool:
    cosine = (got * want).sum(axis=1) / np.linalg.norm(got, axis=1) / np.linalg.norm(want, axis=1)
    return bool(cosine.min() >= 0.99999)


def test_auto_runs_a_bert_embedder_served_in_float32_through_the_graph_on_packed_rows(
    tmp_path: Path, two_threads: None, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """--runtime auto (the default) runs every pass of a BERT embedding model served in float32 on a CPU without
    AVX-512 through the graph on packed rows, batches filled and two passes at once (on the one-thread session) as
    torch's, and says so. On a first start (the graph not cached) torch serves at once while a thread exports the
    graph, which then takes over; passes running meanwhile are answered throughout, each torch float32's vectors. The
    next start loads it."""
    monkeypatch.setattr(loader, "has_avx512", lambda: False)  # an AVX2 CPU, whichever this host is
    folder = tiny_bert(tmp_path / "model", 4)
    cache = tmp_path / "c"
    assert Config().runtime == "auto"
    reference = load_model(Config(model=str(folder), device="cpu", dtype="float32", runtime="torch")).runner
    rows = [np.arange(1000, 1000 + n, dtype=np.int32) for n in (5, 17, 40, 3)]
    expected = reference.run_texts(rows, None)
    with caplog.at_level(logging.INFO, logger="poolserve.engine"):
        first = load_model(Config(model=str(folder), device="cpu", dtype="float32", onnx_cache_dir=str(cache)))
        assert "BertModel's ONNX graph is not cached yet; torch serves until a thread of the engine has" in caplog.text
        later = first.runner
        assert isinstance(later, LaterGraph) and first.packs_tokens and first.passes_at_once == 2
        assert first.pairs_on_lanes  # two clients on the lanes, torch's passes included until the graph takes over
        answered: list[bool] = []
        while not later.switched.wait(0.05):  # passes while the graph is made, then swapped in
            answered.append(agrees(later.run_texts(rows, None), expected))
        answered.append(agrees(later.run_texts(rows, None), expected))
        assert all(answered) and len(answered) > 1
    encoder = later.current.model  # type: ignore[attr-defined]
    assert isinstance(encoder, OnnxEncoder) and encoder.packed and encoder.small is not encoder.full
    assert "--runtime auto (ONNX Runtime for every pass): BertModel from" in caplog.text
    # only the graph it serves is kept, and its weights
    assert sorted(path.name for path in cache.glob("*/*.onnx*")) == ["packed.onnx", "packed.onnx.data"]
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="poolserve.engine"):
        loaded = load_model(Config(model=str(folder), device="cpu", dtype="float32", onnx_cache_dir=str(cache)))
    assert isinstance(loaded.runner.model, OnnxEncoder)  # type: ignore[attr-defined]  # the cached graph, at once
    assert loaded.packs_tokens and loaded.passes_at_once == 2 and loaded.pairs_on_lanes
    assert "not cached yet" not in caplog.text
    assert agrees(loaded.runner.run_texts(rows, None), expected)


def test_a_graph_made_after_the_start_that_fails_leaves_torch_serving(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A graph the thread cannot make (here a file stands where the graph's folder would be in the cache, which the
    export's process cannot write into) leaves torch serving, with the warning a start would give."""
    folder = tiny_bert(tmp_path / "model", 8)
    cache = tmp_path / "c"
    in_the_way = graph_target(folder, "BertModel", cache).parent
    cache.mkdir()
    in_the_way.write_bytes(b"not a folder")
    with caplog.at_level(logging.INFO, logger="poolserve.engine"):
        loaded = load_model(Config(model=str(folder), device="cpu", dtype="float32", onnx_cache_dir=str(cache)))
        later = loaded.runner
        assert isinstance(later, LaterGraph)
        torch_runner = later.current
        assert later.switched.wait(120)
    assert later.current is torch_runner and torch_runner.packed  # type: ignore[attr-defined]
    assert "--runtime auto: torch serves on, the ONNX graph failed:" in caplog.text
    assert later.run_texts([np.arange(1000, 1010, dtype=np.int32)], None).shape == (1, TINY["hidden_size"])


def test_auto_with_int8_runs_the_small_passes_through_the_graph_and_the_rest_through_int8(
    two_threads: None, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With --dtype int8 on a CPU without native bfloat16 torch's int8 layers run the larger passes (faster there than
    the float32 graph), the graph the small ones."""
    monkeypatch.setattr(loader, "has_native_bf16", lambda: False)  # an AVX2 CPU, whichever this host is
    monkeypatch.setattr(loader, "has_avx512", lambda: False)
    with caplog.at_level(logging.INFO, logger="poolserve.engine"):
        loaded = load_model(Config(device="cpu", dtype="int8"))  # the bundled model; the graph in the default cache
        runner = loaded.runner
        if isinstance(runner, LaterGraph):  # the default cache did not hold it yet
            assert runner.switched.wait(120)
            runner = runner.current
    assert isinstance(runner, SmallPassRunner) and loaded.passes_at_once == 2
    assert loaded.pairs_on_lanes  # two clients' lone sentences on the lanes, through the graph's one-thread session
    assert "--runtime auto (hybrid): BertModel from" in caplog.text


def test_auto_on_an_avx512_cpu_runs_float32_as_hybrid(
    exported: Exported, two_threads: None, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On an AVX-512 CPU torch's packed float32 layers run any pass but a lone sentence's faster than the graph
    (docs/benchmarks.md, "The race on an AVX-512 CPU"): auto serving float32 there is hybrid, the graph for a lone
    sentence and torch for the rest (two clients' sentences held into one pass, not on the lanes), and the log says
    why."""
    monkeypatch.setattr(loader, "has_avx512", lambda: True)
    with caplog.at_level(logging.INFO, logger="poolserve.engine"):
        loaded = load_model(Config(model=str(exported.folder), device="cpu", dtype="float32",
                                   onnx_cache_dir=str(exported.cache)))  # fmt: skip
    runner = loaded.runner
    assert isinstance(runner, SmallPassRunner) and loaded.packs_tokens
    assert not loaded.pairs_on_lanes  # two clients' sentences held into one pass, which torch runs on every thread
    assert isinstance(runner.small.model, OnnxEncoder)  # type: ignore[attr-defined]
    assert not isinstance(runner.large.model, OnnxEncoder)  # type: ignore[attr-defined]
    assert "--runtime auto (hybrid): BertModel from" in caplog.text
    assert (
        "for passes of one input of at most 128 padded tokens (torch runs the rest: its packed float32" in caplog.text
    )
    rows = [np.arange(1000, 1000 + n, dtype=np.int32) for n in (10, 30, 60)]
    # a lone sentence through the graph; two short ones (60 padded tokens) through torch, faster there on AVX-512
    assert runner.runner_for(rows[:1]) is runner.small and runner.runner_for(rows[:2]) is runner.large
    reference = load_model(Config(model=str(exported.folder), device="cpu", dtype="float32", runtime="torch"))
    for batch in (rows[:1], rows):  # the graph's pass, then torch's
        assert agrees(runner.run_texts(batch, None), reference.runner.run_texts(batch, None))


NOT_MEASURED: dict[str, tuple[DType, str]] = {
    "bert": ("bfloat16", "bfloat16 is served, the graph is float32"),
    "classifier": ("float32", "a classifier model"),
    "roberta": ("float32", "RobertaModel's graph has not been measured against torch (BertModel's has)"),
    "int8, native bf16": (
        "int8",
        "--dtype int8 runs a lone sentence's layers in bfloat16 on this CPU, as fast as the graph or faster",
    ),
}


@pytest.mark.parametrize("model", NOT_MEASURED)
def test_auto_serves_torch_where_the_graph_was_not_measured_to_win_and_says_why(
    tmp_path: Path,
    classifier_model: Path,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
    model: str,
) -> None:
    dtype, why = NOT_MEASURED[model]
    if model == "int8, native bf16":  # its lone sentence in bfloat16 (on an AVX-512 host as fast as the graph or more)
        monkeypatch.setattr(loader, "has_native_bf16", lambda: True)
    if model == "classifier":
        folder = classifier_model
    elif model == "roberta":
        torch.manual_seed(5)
        folder = tmp_path / "model"
        network = RobertaModel(RobertaConfig(vocab_size=30522, max_position_embeddings=130, **TINY)).eval()
        save_with_tokenizer(network, folder)
    else:
        folder = tiny_bert(tmp_path / "model", 5)
    cache = tmp_path / "cache"
    with caplog.at_level(logging.INFO, logger="poolserve.engine"):
        loaded = load_model(Config(model=str(folder), device="cpu", dtype=dtype, onnx_cache_dir=str(cache)))
    assert not isinstance(loaded.runner, SmallPassRunner) and not loaded.pairs_on_lanes
    assert not isinstance(getattr(loaded.runner, "model", None), OnnxEncoder)
    assert f"--runtime auto: torch runs every pass ({why})" in caplog.text
    assert not cache.exists()  # nothing exported


def test_auto_serves_torch_when_the_graph_cannot_be_had_where_hybrid_refuses(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A graph auto chose but cannot have (here the cache directory cannot be made: a file is in its place) costs
    only its speed, with a warning; --runtime hybrid, asked for by name, refuses to start."""
    folder = tiny_bert(tmp_path / "model", 6)
    cache = tmp_path / "cache"
    cache.write_bytes(b"not a directory")
    with caplog.at_level(logging.INFO, logger="poolserve.engine"):
        loaded = load_model(Config(model=str(folder), device="cpu", dtype="float32", onnx_cache_dir=str(cache)))
    assert loaded.runner.packed  # type: ignore[attr-defined]  # torch's packed modules
    assert "--runtime auto: torch runs every pass, the ONNX graph failed" in caplog.text
    with pytest.raises(LoadError, match="--runtime hybrid cannot export BertModel"):
        load_model(
            Config(model=str(folder), device="cpu", dtype="float32", runtime="hybrid", onnx_cache_dir=str(cache))
        )


def test_the_graph_weights_lie_in_a_file_beside_it_that_its_sessions_map(exported: Exported) -> None:
    """The cached graph's weights lie in packed.onnx.data beside it, each from a multiple of a page, so that ONNX
    Runtime maps them from the file (its sessions then share the pages of those it does not repack) instead of
    copying them into each session's memory."""
    loaded = load_model(onnx_config(exported.folder, exported.cache))
    encoder = loaded.runner.model  # type: ignore[attr-defined]
    assert isinstance(encoder, OnnxEncoder) and encoder.small is not encoder.full
    weights = encoder.path.with_name(WEIGHTS_NAME)
    graph = onnx.load(str(encoder.path), load_external_data=False)
    apart = {
        tensor.name: {entry.key: entry.value for entry in tensor.external_data}
        for tensor in graph.graph.initializer
        if tensor.data_location == onnx.TensorProto.EXTERNAL
    }
    assert apart and all(entry["location"] == WEIGHTS_NAME for entry in apart.values())
    assert all(int(entry["offset"]) % 4096 == 0 for entry in apart.values())
    assert sum(int(entry["length"]) for entry in apart.values()) > 0.9 * weights.stat().st_size
    embeddings = next(name for name in apart if "word_embeddings" in name)
    assert int(apart[embeddings]["length"]) == 30522 * TINY["hidden_size"] * 4
    assert str(weights.resolve()) in Path("/proc/self/maps").read_text()  # mapped, not read into memory


def config_entry(session: object, key: str) -> str | None:
    """A session's config entry, None where it was not set (ONNX Runtime raises for one it does not hold)."""
    try:
        return session.get_session_options().get_session_config_entry(key)  # type: ignore[attr-defined,no-any-return]
    except RuntimeError:
        return None


def test_the_graph_spins_within_a_pass_and_stops_once_it_is_done(exported: Exported, two_threads: None) -> None:
    """The graph's sessions spin-wait within a pass, between one operator's parallel work and the next (a sleeping
    thread's wake-up cost a lone sentence 8-17 % of its pass), and stop as the pass returns, leaving the cores to the
    API servers and to torch's next pass (ONNX Runtime's default spins on: ~65 ms of a core after each MiniLM pass)."""
    loaded = load_model(onnx_config(exported.folder, exported.cache))
    encoder = loaded.runner.model  # type: ignore[attr-defined]
    assert isinstance(encoder, OnnxEncoder)
    for session in (encoder.full, encoder.small):
        assert config_entry(session, "session.intra_op.allow_spinning") in (None, "1")  # spins within a pass
        assert config_entry(session, "session.force_spinning_stop") == "1"
    # The graph's sessions as the engine makes them, alone in a process (this worker's other threads cost CPU too):
    # three passes on both threads (the pool's second thread works, then waits), then the process's CPU, every
    # thread's, over half a second. ONNX Runtime's default spent 64 ms there.
    after_passes = f"""
import time, torch
from engine_core.onnx_runtime import OnnxEncoder
encoder = OnnxEncoder(__import__("pathlib").Path({str(encoder.path)!r}), 2, spin=False)
ids = torch.arange(1000, 1100).reshape(1, -1).repeat(8, 1)
mask = (torch.arange(100)[None, :] < torch.tensor([100, 90, 80, 70, 60, 50, 40, 30])[:, None]).long()
for _ in range(3):
    encoder(ids, mask)
started = time.process_time()
time.sleep(0.5)
print(time.process_time() - started)
"""
    done = subprocess.run(
        [sys.executable, "-c", after_passes], capture_output=True, text=True, check=True, timeout=120, cwd=REPO
    )
    assert float(done.stdout.split()[-1]) < 0.01, done.stdout


def test_onnxruntime_runs_packed_rows_fills_batches_and_runs_two_passes_at_once(
    tmp_path: Path, exported: Exported, two_threads: None
) -> None:
    """The graph runs a batch laid end to end in rows (engine_core/packed_graph.py; inputs longer than a row widen
    it): the scheduler fills its batches as for torch's packing, and two passes at once share the one-thread session,
    each answering torch float32's vectors."""
    folder = exported.folder
    loaded = load_model(onnx_config(folder, exported.cache))
    reference = load_model(Config(model=str(folder), device="cpu", dtype="float32", runtime="torch")).runner
    assert loaded.packs_tokens and loaded.passes_at_once == 2
    encoder = loaded.runner.model  # type: ignore[attr-defined]
    assert isinstance(encoder, OnnxEncoder) and encoder.packed and encoder.path.name == "packed.onnx"
    assert encoder.small is not encoder.full  # a one-thread session for the passes on one thread
    written = tmp_path / "written"  # readable as any file this process writes (a temporary file is not)
    written.write_bytes(b"")
    assert encoder.path.stat().st_mode & 0o777 == written.stat().st_mode & 0o777
    rows = [np.arange(1000, 1000 + n, dtype=np.int32) for n in (5, 17, 40, 70, 100, 3)]
    batches = [rows, rows[::-1][:4], rows[2:3]]
    expected = [reference.run_texts(batch, None) for batch in batches]

    assert all(agrees(loaded.runner.run_texts(b, None), e) for b, e in zip(batches, expected, strict=True))
    answers: dict[int, np.ndarray] = {}

    def lane(index: int) -> None:  # as the engine's two passes at once run: one torch thread each
        torch.set_num_threads(1)
        for _ in range(5):
            answers[index] = loaded.runner.run_texts(batches[index], None)

    lanes = [threading.Thread(target=lane, args=(index,)) for index in (0, 1)]
    for thread in lanes:
        thread.start()
    for thread in lanes:
        thread.join()
    assert agrees(answers[0], expected[0]) and agrees(answers[1], expected[1])
