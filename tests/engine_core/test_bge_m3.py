"""engine_core/bge_m3.py and its place in the engine: bge-m3's three outputs from one batch, its lexical weights kept
sparse through the request's state and the cache (tests/fidelity holds them to BGEM3FlagModel)."""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import msgspec
import numpy as np
import pytest
import torch

from engine_core.admission import AdmissionLimit
from engine_core.bge_m3 import M3Heads, M3Runner
from engine_core.core import EngineCore
from engine_core.embedding_cache import EmbeddingCache
from engine_core.load_model import load_model
from engine_core.loader import LoadedModel
from engine_core.request_state import InvalidRequest, check_request
from engine_core.runner import SparseRow
from poolserve.config import Config
from poolserve.protocol import EngineRequest, SparseRows
from tests.engine_core.pending import pool_request
from tests.fidelity.bge_m3_layouts import build_bge_m3

HELLO = [0, 35, 61, 35, 2]  # <s> ... </s>, token 35 twice
WORLD = [0, 71, 9, 2]


@pytest.fixture(scope="module")
def loaded(tmp_path_factory: pytest.TempPathFactory) -> LoadedModel:
    folder = tmp_path_factory.mktemp("bge-m3") / "bge-m3"
    build_bge_m3(folder)
    return dataclasses.replace(load_model(Config(model=str(folder), device="cpu")), batch_overhead_tokens=64.0)


def run(core: EngineCore, *jobs: EngineRequest) -> dict[int, object]:
    for request_id, job in enumerate(jobs, 1):
        job.id = request_id
        request = check_request(b"api-0", job, core.card)
        assert core.admission.try_admit(request.count, request.total_cost)
        core.add(request)
    answers: dict[int, object] = {}
    while (batch := core.next_batch()) is not None:
        step = core.run_batch(batch)
        assert not step.failures
        answers.update({out.id: rows for out, rows in step.outputs[b"api-0"]})
    cached = core.take_answered_from_cache()
    if cached is not None:
        answers.update({out.id: rows for out, rows in cached.outputs[b"api-0"]})
    return answers


def test_a_bge_m3_folder_is_a_dense_embedder_with_sparse_and_colbert_outputs_kept_in_float32(
    loaded: LoadedModel,
) -> None:
    card = loaded.card
    assert (card.kind, card.pooling, card.normalize, card.dtype) == ("embedding", "cls", True, "float32")
    assert card.outputs == ["vector", "sparse", "multi_vector"] and card.output == "vector"
    assert "embed_sparse" in card.tasks and "token_embed" in card.tasks and "embed" in card.tasks
    assert card.late_interaction is not None and card.late_interaction.drops_first
    assert not card.is_late_interaction and card.has_sparse_output
    assert isinstance(loaded.runner, M3Runner)


def test_lexical_weights_keep_each_ids_largest_positive_weight_without_the_unused_tokens() -> None:
    hidden = 4
    sparse = torch.nn.Linear(hidden, 1)
    runner = M3Runner(
        torch.nn.Identity(), m3=M3Heads(sparse, torch.nn.Linear(hidden, hidden)), unused_ids=[0, 1, 2, 3],
        pooling=("cls",), pad_token_id=1, device=torch.device("cpu"),
    )  # fmt: skip
    ids = np.asarray([0, 9, 5, 9, 7, 3, 2], dtype=np.int32)
    weights = np.asarray([5.0, 0.2, 0.4, 0.7, 0.0, 3.0, 4.0], dtype=np.float32)
    indices, values = runner._lexical_weights(ids, weights)
    assert indices.tolist() == [5, 9] and values.tolist() == pytest.approx([0.4, 0.7])
    assert runner._lexical_weights(ids[:1], weights[:1]).indices.size == 0


def test_one_batch_answers_dense_rows_colbert_vectors_and_lexical_weights_side_by_side(loaded: LoadedModel) -> None:
    core = EngineCore(loaded, AdmissionLimit(max_inputs=64, max_tokens=4096), EmbeddingCache(1 << 20))
    rows = [HELLO, WORLD]
    jobs = (
        pool_request(rows),
        pool_request(rows, per_token=True),
        pool_request(rows, sparse=True),
        pool_request(rows, sparse=True, normalize=True),
    )
    answers = run(core, *jobs)
    dense, colbert, lexical, unit = (answers[i] for i in (1, 2, 3, 4))
    assert isinstance(dense, np.ndarray) and dense.shape == (2, loaded.card.output_size)
    np.testing.assert_allclose(np.linalg.norm(dense, axis=1), 1, atol=1e-6)
    # Every token's vector but the CLS's, normalized.
    assert isinstance(colbert, np.ndarray) and colbert.shape[0] == len(HELLO) - 1 + len(WORLD) - 1
    np.testing.assert_allclose(np.linalg.norm(colbert, axis=1), 1, atol=1e-6)
    assert isinstance(lexical, SparseRows) and lexical.dim == loaded.card.vocab_size
    for i, row in enumerate(rows):
        indices, values = lexical.row(i)
        assert set(indices.tolist()) <= set(row) - {0, 1, 2, 3} and (values > 0).all()
    assert isinstance(unit, SparseRows)
    np.testing.assert_allclose(unit.values, lexical.values / np.repeat(
        [np.linalg.norm(lexical.row(i)[1]) for i in range(2)], lexical.nonzeros), atol=1e-6)  # fmt: skip
    # Asked again, each comes from the cache under its own key, the lexical weights still sparse.
    again = run(core, *jobs)
    np.testing.assert_array_equal(again[2], colbert)
    cached = again[3]
    assert isinstance(cached, SparseRows) and cached.indices.tolist() == lexical.indices.tolist()
    assert sum(isinstance(row, SparseRow) for row in core.cache._rows.values()) == len(rows)


def test_a_sparse_output_is_refused_where_the_model_has_none_or_with_token_vectors(loaded: LoadedModel) -> None:
    card = loaded.card
    for job, message in (
        (pool_request([HELLO], sparse=True, per_token=True), "one row per text"),
        (pool_request([HELLO], sparse=True, dimensions=4), "leading dimensions"),
    ):
        with pytest.raises(InvalidRequest, match=message):
            check_request(b"api-0", job, card)
    dense_only = msgspec.structs.replace(card, extra_outputs=[])
    job = pool_request([HELLO], sparse=True)
    with pytest.raises(InvalidRequest, match="no sparse output"):
        check_request(b"api-0", job, dense_only)


def copy_without(folder: Path, target: Path, *left_out: str) -> Path:
    """The folder but the files and folders named."""
    shutil.copytree(folder, target, ignore=lambda _, names: [name for name in names if name in left_out])
    return target


def test_one_head_file_alone_serves_the_dense_embedder(tmp_path: Path, loaded: LoadedModel) -> None:
    alone = copy_without(Path(loaded.card.path), tmp_path / "one-head", "sparse_linear.pt")
    card = load_model(Config(model=str(alone), device="cpu", dtype="float32")).card
    assert card.outputs == ["vector"] and card.late_interaction is None and "embed_sparse" not in card.tasks


def test_without_sentence_transformers_files_the_dense_vector_is_bgem3flagmodels_own_cls(
    tmp_path: Path, loaded: LoadedModel
) -> None:
    st_files = ("modules.json", "sentence_bert_config.json", "config_sentence_transformers.json", "1_Pooling",
                "2_Normalize")  # fmt: skip
    bare = copy_without(Path(loaded.card.path), tmp_path / "bare", *st_files)
    card = load_model(Config(model=str(bare), device="cpu", dtype="float32")).card
    assert (card.pooling, card.normalize, card.outputs) == ("cls", True, ["vector", "sparse", "multi_vector"])
