"""Token packing (engine_core/packed_encoder.py): a BERT, RoBERTa, XLM-RoBERTa, MPNet or ModernBERT model run on its
real tokens answers what its own padded forward answers, and the loader turns it on only where it is meant to."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from transformers import (
    AutoModel,
    BertConfig,
    BertForSequenceClassification,
    BertModel,
    DistilBertConfig,
    DistilBertModel,
    ModernBertConfig,
    ModernBertForSequenceClassification,
    ModernBertModel,
    MPNetConfig,
    MPNetForSequenceClassification,
    MPNetModel,
    RobertaConfig,
    RobertaModel,
    XLMRobertaConfig,
    XLMRobertaForSequenceClassification,
    XLMRobertaModel,
)

from bench.harness.models import TINY, save_with_tokenizer
from engine_core import packed_encoder
from engine_core.load_model import load_model
from engine_core.packed_encoder import (
    JOINED,
    SCORES_AT_ONCE,
    Grid,
    attention_projections,
    join_projections,
    length_groups,
    packable,
    packed_last_hidden_state,
    packed_logits,
    unjoin_projections,
)
from engine_core.runner import ClassifierRunner, EmbeddingRunner, TextBatch
from engine_core.scheduler import Scheduler, WorkItem
from poolserve.config import Config
from tests.engine_core.pending import make_request

CPU = torch.device("cpu")


def rows_of(lengths: list[int], seed: int) -> list[np.ndarray]:
    """Token id rows of these lengths, starting with [CLS] and ending with [SEP] as the tokenizer's do."""
    rng = np.random.default_rng(seed)
    return [np.concatenate([[101], rng.integers(1000, 29000, n - 2), [102]]).astype(np.int32) for n in lengths]


# Lengths as a window of corpus sentences holds them: a single token row, short and long ones unsorted.
LENGTHS = [12, 3, 47, 20, 33, 9, 61, 28]


@pytest.fixture(scope="module")
def minilm(bundled_model: Path) -> torch.nn.Module:
    return AutoModel.from_pretrained(bundled_model).eval()


def test_the_bundled_model_packed_gives_the_padded_forward_s_token_states_and_pooled_rows(
    minilm: torch.nn.Module,
) -> None:
    assert packable(minilm)
    rows = rows_of(LENGTHS, seed=0)
    padded = EmbeddingRunner(minilm, pooling=("mean",), pad_token_id=0, device=CPU)
    packed = EmbeddingRunner(minilm, pooling=("mean",), pad_token_id=0, device=CPU, packed=True)
    for batch_rows in (rows, rows[:1], rows_of([17, 17, 17], seed=6)):  # and batches without padding
        np.testing.assert_allclose(
            packed.run_texts(batch_rows, None), padded.run_texts(batch_rows, None), atol=1e-5, rtol=0
        )
    asked = [i % 2 == 0 for i in range(len(rows))]
    for mine, theirs in zip(
        packed.run_texts_per_token(rows, None, asked), padded.run_texts_per_token(rows, None, asked), strict=True
    ):
        assert mine.shape == theirs.shape
        np.testing.assert_allclose(mine, theirs, atol=1e-5, rtol=0)
    with torch.inference_mode():
        batch = TextBatch(rows, None, 0, CPU)
        states = packed_last_hidden_state(minilm, batch.input_ids, batch.mask, None)
    assert not states[~batch.mask].any(), "the padding's states are zeros"


def test_packed_in_bfloat16_stays_with_the_float32_model(minilm: torch.nn.Module) -> None:
    rows = rows_of(LENGTHS, seed=1)
    reference = EmbeddingRunner(minilm, pooling=("mean",), pad_token_id=0, device=CPU).run_texts(rows, None)
    half = AutoModel.from_pretrained(minilm.name_or_path, dtype=torch.bfloat16).eval()
    packed = EmbeddingRunner(half, pooling=("mean",), pad_token_id=0, device=CPU, packed=True).run_texts(rows, None)
    cosine = (packed * reference).sum(1) / np.linalg.norm(packed, axis=1) / np.linalg.norm(reference, axis=1)
    assert cosine.min() >= 0.999  # bf16 itself against float32: >= 0.9999 on the corpus (docs/benchmarks.md)


def tiny_bert(**changes: object) -> BertModel:
    torch.manual_seed(5)
    return BertModel(BertConfig(vocab_size=30522, max_position_embeddings=128, **TINY, **changes)).eval()


def test_token_types_are_packed_with_their_tokens() -> None:
    model = tiny_bert(type_vocab_size=2)
    rows = rows_of([9, 30, 17], seed=2)
    types = [np.asarray([0] * (len(row) // 2) + [1] * (len(row) - len(row) // 2), dtype=np.int32) for row in rows]
    padded = EmbeddingRunner(model, pooling=("cls",), pad_token_id=0, device=CPU).run_texts(rows, types)
    packed = EmbeddingRunner(model, pooling=("cls",), pad_token_id=0, device=CPU, packed=True).run_texts(rows, types)
    np.testing.assert_allclose(packed, padded, atol=1e-5, rtol=0)
    assert not np.allclose(
        packed, EmbeddingRunner(model, pooling=("cls",), pad_token_id=0, device=CPU).run_texts(rows, None)
    )


def test_a_bert_cross_encoder_packed_gives_its_logits() -> None:
    torch.manual_seed(6)
    model = BertForSequenceClassification(
        BertConfig(vocab_size=30522, num_labels=3, max_position_embeddings=128, **TINY)
    ).eval()
    assert packable(model)
    rows = rows_of([40, 6, 22, 13], seed=3)
    types = [np.asarray([0] * 4 + [1] * (len(row) - 4), dtype=np.int32) for row in rows]
    padded = ClassifierRunner(model, pad_token_id=0, device=CPU).run_texts(rows, types)
    packed = ClassifierRunner(model, pad_token_id=0, device=CPU, packed=True).run_texts(rows, types)
    np.testing.assert_allclose(packed, padded, atol=1e-5, rtol=0)
    with torch.inference_mode():
        batch = TextBatch(rows, types, 0, CPU)
        assert packed_logits(model, batch.input_ids, batch.mask, batch.token_type_ids).shape == (4, 3)


# RoBERTa's, XLM-RoBERTa's and MPNet's padding id is 1 (their positions count from 2, each input's own); ModernBERT's
# local window of 8 places either side is shorter than most of LENGTHS, so the window is on the grid's places too.
ROBERTA_SIZES = {"vocab_size": 30522, "max_position_embeddings": 130, "pad_token_id": 1, **TINY}
MODERNBERT_SIZES = {"vocab_size": 30522, "max_position_embeddings": 128, "pad_token_id": 0, "local_attention": 16,
                    "bos_token_id": 101, "eos_token_id": 102, "cls_token_id": 101, "sep_token_id": 102,
                    **TINY}  # fmt: skip
ENCODERS = {
    "xlm-roberta": (lambda: XLMRobertaModel(XLMRobertaConfig(**ROBERTA_SIZES)), 1),
    "roberta": (lambda: RobertaModel(RobertaConfig(**ROBERTA_SIZES)), 1),
    "mpnet": (lambda: MPNetModel(MPNetConfig(**{**ROBERTA_SIZES, "num_hidden_layers": 3})), 1),
    "modernbert": (lambda: ModernBertModel(ModernBertConfig(**{**MODERNBERT_SIZES, "num_hidden_layers": 3})), 0),
}


@pytest.mark.parametrize("architecture", list(ENCODERS))
def test_each_architecture_packed_gives_its_padded_forward_s_token_states_and_pooled_rows(architecture: str) -> None:
    build, pad = ENCODERS[architecture]
    torch.manual_seed(8)
    model = build().eval()
    assert packable(model)
    rows = rows_of([*LENGTHS, 100, 2], seed=4)
    for pooling in (("mean",), ("cls",)):
        padded = EmbeddingRunner(model, pooling=pooling, pad_token_id=pad, device=CPU)
        packed = EmbeddingRunner(model, pooling=pooling, pad_token_id=pad, device=CPU, packed=True)
        np.testing.assert_allclose(packed.run_texts(rows, None), padded.run_texts(rows, None), atol=1e-5, rtol=0)
    asked = [True] * len(rows)
    for mine, theirs in zip(
        packed.run_texts_per_token(rows, None, asked), padded.run_texts_per_token(rows, None, asked), strict=True
    ):
        assert mine.shape == theirs.shape
        np.testing.assert_allclose(mine, theirs, atol=1e-5, rtol=0)
    with torch.inference_mode():
        batch = TextBatch(rows, None, pad, CPU)
        states = packed_last_hidden_state(model, batch.input_ids, batch.mask, None)
        alone = [
            model(input_ids=batch.input_ids[i : i + 1, : len(row)]).last_hidden_state[0] for i, row in enumerate(rows)
        ]
    assert not states[~batch.mask].any(), "the padding's states are zeros"
    for i, own in enumerate(alone):  # each input's positions are its own: as it runs alone
        torch.testing.assert_close(states[i, : len(rows[i])], own, atol=1e-5, rtol=0)
    for unpadded in (rows[:1], rows_of([17, 17, 17], seed=6)):  # batches without padding run on their own grid
        np.testing.assert_allclose(
            packed.run_texts(unpadded, None), padded.run_texts(unpadded, None), atol=1e-5, rtol=0
        )


CLASSIFIERS = {
    "xlm-roberta": (lambda: XLMRobertaForSequenceClassification(XLMRobertaConfig(num_labels=1, **ROBERTA_SIZES)), 1),
    "mpnet": (lambda: MPNetForSequenceClassification(MPNetConfig(num_labels=2, **ROBERTA_SIZES)), 1),
    "modernbert-cls": (
        lambda: ModernBertForSequenceClassification(ModernBertConfig(num_labels=1, **MODERNBERT_SIZES)),
        0,
    ),
    "modernbert-mean": (
        lambda: ModernBertForSequenceClassification(
            ModernBertConfig(num_labels=3, classifier_pooling="mean", **MODERNBERT_SIZES)
        ),
        0,
    ),
}


@pytest.mark.parametrize("architecture", list(CLASSIFIERS))
def test_each_architecture_s_cross_encoder_packed_gives_its_logits(architecture: str) -> None:
    build, pad = CLASSIFIERS[architecture]
    torch.manual_seed(9)
    model = build().eval()
    assert packable(model)
    rows = rows_of([40, 6, 22, 13, 90], seed=5)
    padded = ClassifierRunner(model, pad_token_id=pad, device=CPU).run_texts(rows, None)
    packed = ClassifierRunner(model, pad_token_id=pad, device=CPU, packed=True).run_texts(rows, None)
    assert packed.shape == (5, model.config.num_labels)
    np.testing.assert_allclose(packed, padded, atol=1e-5, rtol=0)


JOINABLE = {
    "bert": (lambda: tiny_bert(type_vocab_size=2), 0),
    **{name: ENCODERS[name] for name in ("xlm-roberta", "roberta", "mpnet")},
    "bert-cross-encoder": (
        lambda: BertForSequenceClassification(BertConfig(vocab_size=30522, num_labels=2, **TINY)),
        0,
    ),
    **{f"{name}-cross-encoder": CLASSIFIERS[name] for name in ("xlm-roberta", "mpnet")},
}


@pytest.mark.parametrize("architecture", list(JOINABLE))
def test_query_key_and_value_joined_in_one_product_give_the_padded_forward_s_answers(architecture: str) -> None:
    build, pad = JOINABLE[architecture]
    torch.manual_seed(10)
    model = build().eval()
    rows = rows_of([*LENGTHS, 100, 2], seed=7)
    classifier = "cross-encoder" in architecture
    runner_type = ClassifierRunner if classifier else EmbeddingRunner
    options = {} if classifier else {"pooling": ("mean",)}
    padded = runner_type(model, pad_token_id=pad, device=CPU, **options)  # type: ignore[operator]
    packed = runner_type(model, pad_token_id=pad, device=CPU, packed=True, **options)  # type: ignore[operator]
    batches = (rows, rows[:1], rows_of([17, 17, 17], seed=6))  # on grids of like lengths, one grid, no padding
    expected = [padded.run_texts(batch, None) for batch in batches]
    modules = attention_projections(model)
    assert len(modules) == model.config.num_hidden_layers
    replaced = join_projections(model)
    assert len(replaced) == len(modules)
    for attention, names in modules:
        assert isinstance(getattr(attention, JOINED), torch.nn.Linear)
        assert not any(hasattr(attention, name) for name in names), "the separate layers leave the module"
    for batch, answers in zip(batches, expected, strict=True):
        np.testing.assert_allclose(packed.run_texts(batch, None), answers, atol=1e-5, rtol=0)
    unjoin_projections(replaced)
    assert not any(hasattr(attention, JOINED) for attention, _ in modules)
    np.testing.assert_array_equal(padded.run_texts(rows, None), expected[0])  # its own forward runs again


def test_only_query_key_and_value_of_one_shape_and_kind_are_joined() -> None:
    model = tiny_bert()
    first = model.encoder.layer[0].attention.self
    first.value = torch.nn.Linear(first.value.in_features, first.value.out_features, bias=False)
    replaced = join_projections(model)
    assert len(replaced) == model.config.num_hidden_layers - 1
    assert not hasattr(first, JOINED) and hasattr(first, "query")


@pytest.mark.parametrize("mask_kind", ["none", "keys", "bias", "window"])
def test_attention_as_products_gives_torch_s_kernel_s_answers(mask_kind: str) -> None:
    """Every mask the encoders hand it (none, each input's keys, MPNet's bias with -inf at the padding, ModernBERT's
    window of places), on grids split into several runs of scores (SCORES_AT_ONCE) and wider than it takes."""
    torch.manual_seed(11)
    for count, width in ((1, 9), (3, 40), (SCORES_AT_ONCE // (4 * 30 * 30) + 5, 30), (2, 200)):
        query, key, value = (torch.randn(count, 4, width, 8) for _ in range(3))
        keys = torch.ones(count, 1, 1, width, dtype=torch.bool)
        keys[0, ..., width // 2 :] = False
        places = torch.arange(width)
        masks = {
            "none": None,
            "keys": keys,
            "bias": torch.randn(count, 4, width, width).masked_fill(~keys, float("-inf")),
            "window": (places[None, :] - places[:, None]).abs() <= 4,
        }
        mask = masks[mask_kind]
        expected = F.scaled_dot_product_attention(query, key, value, attn_mask=mask, scale=0.3)
        torch.testing.assert_close(packed_encoder.attention(query, key, value, mask, 0.3), expected, atol=2e-6, rtol=0)
        half = packed_encoder.attention(query.bfloat16(), key.bfloat16(), value.bfloat16(), mask, 0.3)
        assert half.dtype == torch.bfloat16
        torch.testing.assert_close(half.float(), expected, atol=0.05, rtol=0)


def test_only_the_encoders_it_reproduces_are_packable() -> None:
    assert packable(tiny_bert())
    assert not packable(tiny_bert(is_decoder=True))
    assert not packable(RobertaModel(RobertaConfig(is_decoder=True, **ROBERTA_SIZES)))
    distilbert = DistilBertModel(
        DistilBertConfig(vocab_size=30522, dim=32, n_layers=2, n_heads=4, hidden_dim=64)
    ).eval()
    assert not packable(distilbert)
    headless = BertForSequenceClassification(BertConfig(vocab_size=30522, num_labels=2, **TINY)).eval()
    headless.bert.pooler = None
    assert not packable(headless)


def test_the_loader_packs_on_the_cpu_unless_told_not_to(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="poolserve.engine"):
        auto = load_model(Config(device="cpu", dtype="float32", runtime="torch"))
    assert auto.packs_tokens and auto.runner.packed  # type: ignore[attr-defined]
    # packed, each layer's query, key and value are one product; run padded, the model's own forward needs all three
    assert "6 attention layers' query, key and value computed in one product each" in caplog.text
    assert all(hasattr(attention, JOINED) for attention, _ in attention_projections(auto.runner.model))  # type: ignore[attr-defined]
    off = load_model(Config(device="cpu", dtype="float32", token_packing="off", runtime="torch"))
    assert not off.packs_tokens and not off.runner.packed  # type: ignore[attr-defined]
    assert not any(hasattr(attention, JOINED) for attention, _ in attention_projections(off.runner.model))  # type: ignore[attr-defined]
    torch.manual_seed(7)
    folder = tmp_path / "xlm-roberta"
    save_with_tokenizer(XLMRobertaModel(XLMRobertaConfig(**{**ROBERTA_SIZES, "pad_token_id": 0})).eval(), folder)
    assert load_model(Config(model=str(folder), device="cpu", dtype="float32")).packs_tokens
    folder = tmp_path / "distilbert"
    save_with_tokenizer(
        DistilBertModel(DistilBertConfig(vocab_size=30522, dim=32, n_layers=2, n_heads=4, hidden_dim=64)).eval(),
        folder,
    )
    with caplog.at_level(logging.WARNING, logger="poolserve.engine"):
        distilbert = load_model(Config(model=str(folder), device="cpu", dtype="float32", token_packing="on"))
    assert not distilbert.packs_tokens
    assert "is not an encoder this server packs" in caplog.text


def test_a_packed_runner_s_window_is_filled_to_the_caps_not_cut_by_length() -> None:
    """Padding a packed runner does not compute costs no pass: one batch where the padded cost model cuts two."""
    lengths = [4, 4, 4, 60]

    def batches(packed: bool) -> list[list[WorkItem]]:
        scheduler = Scheduler(max_batch_tokens=1000, max_batch_size=8, batch_overhead_tokens=10, packed=packed)
        for i, length in enumerate(lengths):
            scheduler.add(make_request(i, [length]))
        return scheduler.next_batches()

    assert [len(batch) for batch in batches(packed=False)] == [3, 1]
    assert [len(batch) for batch in batches(packed=True)] == [4]


def test_inputs_of_unlike_lengths_attend_on_grids_of_their_own_width() -> None:
    lengths = [12, 3, 47, 20, 33, 9, 61, 28]
    mask = torch.arange(max(lengths))[None, :] < torch.tensor(lengths)[:, None]
    grid = Grid(mask, hidden=8, heads=2)
    groups = length_groups(grid)
    assert len(groups) > 1
    rows = torch.cat([rows for rows, _ in groups])
    assert sorted(rows.tolist()) == list(range(sum(lengths))), "every token in exactly one group"
    starts = np.cumsum([0, *lengths])
    for rows, own in groups:
        members = [i for i in range(len(lengths)) if starts[i] in rows.tolist()]
        assert own.width == max(lengths[i] for i in members) and own.count == len(members)
        assert len(rows) == sum(lengths[i] for i in members)
    # Like lengths share one grid: a second grid would cost more than the padding it saves.
    alike = torch.arange(30)[None, :] < torch.tensor([30, 29, 28, 30, 27, 30])[:, None]
    assert len(length_groups(Grid(alike, hidden=8, heads=2))) == 1
    full = torch.ones(4, 9, dtype=torch.bool)
    assert len(length_groups(Grid(full, hidden=8, heads=2))) == 1
