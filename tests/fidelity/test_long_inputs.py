"""Long inputs chunked (`long_input: chunk`, --long-input chunk): the answers equal a hand computation over the
windows with the reference libraries, in float32.

The windows are cut by transformers' tokenizer (`return_overflowing_tokens` with a stride), not by the code under
test; each window is run through sentence-transformers' own Transformer and Pooling modules (the bundled MiniLM)
or transformers' cross-encoder, and combined as docs/api.md ("Long inputs") says: the token-weighted mean of the
windows' pooled vectors, then normalized; a rerank score is the best window's.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from engine_core.folder_choices import LoadError
from engine_core.loader import LoadedModel
from tests.fidelity.compare import F32
from tests.fidelity.stack import load, serve_in_process

MAX_LEN = 256  # the bundled model's max_seq_length
OVERLAP = 16
LONG_TEXT = " ".join(f"server {i} answers request {i * 7} from rack {i % 13}." for i in range(120))
SHORT_TEXT = "A short sentence fits in one window."
QUERY = "which rack answers request 420"


@pytest.fixture(scope="module")
def minilm(bundled_model: Path) -> LoadedModel:
    return load(bundled_model)


@pytest.fixture(scope="module")
def client(minilm: LoadedModel) -> Iterator[httpx.Client]:
    with serve_in_process(minilm, long_input_overlap=OVERLAP) as served:
        yield served


def windows_of(folder: Path, text: str, max_len: int, overlap: int, query: str | None = None) -> list[dict[str, Any]]:
    """The windows transformers' tokenizer cuts: each with its own special tokens, `overlap` tokens repeated."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    args = (text,) if query is None else (query, text)
    encoded = tokenizer(
        *args, max_length=max_len, truncation=True if query is None else "only_second", stride=overlap,
        return_overflowing_tokens=True,
    )  # fmt: skip
    keys = [key for key in ("input_ids", "token_type_ids", "attention_mask") if key in encoded]
    return [{key: encoded[key][i] for key in keys} for i in range(len(encoded["input_ids"]))]


def reference_embedding(folder: Path, text: str, overlap: int = OVERLAP) -> tuple[F32, int]:
    """sentence-transformers' Transformer and Pooling on each window, one at a time (no padding); the windows'
    mean weighted by their tokens, then its Normalize; and the tokens of all windows."""
    mean, tokens = reference_mean(folder, [w["input_ids"] for w in windows_of(folder, text, MAX_LEN, overlap)])
    return (mean / np.linalg.norm(mean)).astype(np.float32), tokens


@functools.cache
def sentence_transformer(folder: Path) -> Any:
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(folder), device="cpu")


def reference_mean(folder: Path, windows: list[list[int]]) -> tuple[F32, int]:
    """The token-weighted mean of the windows' pooled vectors (before the model's Normalize), and their tokens."""
    import torch

    model = sentence_transformer(folder)
    pooled, weights = [], []
    with torch.inference_mode():
        for window in windows:
            features = {"input_ids": torch.tensor([window]), "attention_mask": torch.ones(1, len(window), dtype=int)}
            features["token_type_ids"] = torch.zeros_like(features["input_ids"])
            pooled.append(model[1](model[0](features))["sentence_embedding"][0].double().numpy())
            weights.append(len(window))
    return np.average(np.stack(pooled), axis=0, weights=weights).astype(np.float32), sum(weights)


def embed(client: httpx.Client, texts: list[str], **body: Any) -> tuple[F32, dict[str, Any]]:
    response = client.post("/v1/embeddings", json={"input": texts, **body})
    assert response.status_code == 200, response.text
    answer = response.json()
    return np.asarray([item["embedding"] for item in answer["data"]], dtype=np.float32), answer["usage"]


def test_a_long_text_chunked_is_the_token_weighted_mean_of_its_windows(
    client: httpx.Client, bundled_model: Path
) -> None:
    expected, window_tokens = reference_embedding(bundled_model, LONG_TEXT)
    assert window_tokens > 2 * MAX_LEN  # three windows at least
    short = sentence_transformer(bundled_model).encode([SHORT_TEXT])[0]
    vectors, usage = embed(client, [SHORT_TEXT, LONG_TEXT], long_input="chunk")
    np.testing.assert_allclose(vectors[1], expected, atol=1e-5)
    np.testing.assert_allclose(vectors[0], short, atol=1e-5)  # an input that fits is embedded as before
    short_tokens = len(windows_of(bundled_model, SHORT_TEXT, MAX_LEN, OVERLAP)[0]["input_ids"])
    assert usage == {"prompt_tokens": window_tokens + short_tokens, "total_tokens": window_tokens + short_tokens}


def test_chunked_vectors_take_dimensions_and_normalize_after_the_mean(
    client: httpx.Client, bundled_model: Path
) -> None:
    windows = [w["input_ids"] for w in windows_of(bundled_model, LONG_TEXT, MAX_LEN, OVERLAP)]
    mean, _ = reference_mean(bundled_model, windows)
    raw, _ = embed(client, [LONG_TEXT], long_input="chunk", normalize=False)
    np.testing.assert_allclose(raw[0], mean, atol=1e-5)
    cut, _ = embed(client, [LONG_TEXT], long_input="chunk", dimensions=64)
    np.testing.assert_allclose(cut[0], mean[:64] / np.linalg.norm(mean[:64]), atol=1e-5)


def test_token_ids_are_cut_as_they_are(client: httpx.Client, bundled_model: Path) -> None:
    """vLLM's cut: the client's ids in pieces of the maximum (the special tokens where the client put them)."""
    from transformers import AutoTokenizer

    ids = AutoTokenizer.from_pretrained(str(bundled_model))(LONG_TEXT)["input_ids"]
    step = MAX_LEN - OVERLAP
    starts = [0, *range(step, len(ids) - OVERLAP, step)]
    windows = [ids[start : start + MAX_LEN] for start in starts]
    assert len(windows) > 2 and starts[-1] + MAX_LEN >= len(ids) > starts[-2] + MAX_LEN
    mean, tokens = reference_mean(bundled_model, windows)
    vectors, usage = embed(client, [ids], long_input="chunk")
    np.testing.assert_allclose(vectors[0], mean / np.linalg.norm(mean), atol=1e-5)
    assert usage["prompt_tokens"] == tokens


def test_the_server_default_chunks_and_a_request_may_still_truncate_or_refuse(
    minilm: LoadedModel, bundled_model: Path
) -> None:
    expected, _ = reference_embedding(bundled_model, LONG_TEXT, overlap=0)
    with serve_in_process(minilm, long_input="chunk") as served:
        vectors, _ = embed(served, [LONG_TEXT])
        np.testing.assert_allclose(vectors[0], expected, atol=1e-5)
        truncated, usage = embed(served, [LONG_TEXT], long_input="truncate")
        cut, cut_usage = embed(served, [LONG_TEXT], truncate_prompt_tokens=-1)
        np.testing.assert_allclose(truncated, cut, atol=1e-6)
        assert usage["prompt_tokens"] == cut_usage["prompt_tokens"] == MAX_LEN
        refused = served.post("/v1/embeddings", json={"input": LONG_TEXT, "long_input": "refuse"})
        assert refused.status_code == 400
        assert refused.json()["error"]["code"] == "context_length_exceeded"


def test_without_chunking_a_long_text_is_refused_as_before(client: httpx.Client) -> None:
    refused = client.post("/v1/embeddings", json={"input": LONG_TEXT})
    assert refused.status_code == 400, refused.text
    assert "truncate_prompt_tokens" in refused.json()["error"]["message"]


def test_chunking_and_truncation_together_are_refused_by_name(client: httpx.Client) -> None:
    refused = client.post(
        "/v1/embeddings", json={"input": LONG_TEXT, "long_input": "chunk", "truncate_prompt_tokens": 100}
    )
    assert refused.status_code == 400, refused.text
    error = refused.json()["error"]
    assert error["param"] == "long_input"
    assert "truncate_prompt_tokens" in error["message"]


def test_every_window_counts_against_the_token_and_queue_limits(minilm: LoadedModel, bundled_model: Path) -> None:
    _, window_tokens = reference_embedding(bundled_model, LONG_TEXT, overlap=0)
    with serve_in_process(minilm, max_tokens_per_request=window_tokens - 1) as served:
        # Truncated, the text fits the budget; its windows together do not.
        assert served.post("/v1/embeddings", json={"input": LONG_TEXT, "long_input": "truncate"}).status_code == 200
        refused = served.post("/v1/embeddings", json={"input": LONG_TEXT, "long_input": "chunk"})
        assert refused.status_code == 400, refused.text
        assert refused.json()["error"]["code"] == "too_many_tokens"
        assert f"{window_tokens} tokens" in refused.json()["error"]["message"]
    with serve_in_process(minilm, max_queued_inputs=2) as served:
        refused = served.post("/v1/embeddings", json={"input": LONG_TEXT, "long_input": "chunk"})
        assert refused.status_code == 413, refused.text
        assert "--max-queued-inputs" in refused.json()["error"]["message"]


def test_a_model_that_pools_by_its_cls_token_refuses_chunking_by_name(bundled_model: Path) -> None:
    with serve_in_process(load(bundled_model, pooling="cls")) as served:
        fits = served.post("/v1/embeddings", json={"input": SHORT_TEXT, "long_input": "chunk"})
        assert fits.status_code == 200, fits.text
        refused = served.post("/v1/embeddings", json={"input": ["ok", LONG_TEXT], "long_input": "chunk"})
        assert refused.status_code == 400, refused.text
        error = refused.json()["error"]
        assert error["param"] == "input[1]"
        assert "pools by 'cls'" in error["message"]


def test_every_token_state_is_not_chunked(client: httpx.Client) -> None:
    refused = client.post("/pooling", json={"input": LONG_TEXT, "task": "token_embed", "long_input": "chunk"})
    assert refused.status_code == 400, refused.text
    assert "every token's state" in refused.json()["error"]["message"]


def test_a_bi_encoder_scores_a_long_document_by_its_best_window(client: httpx.Client, bundled_model: Path) -> None:
    import torch

    model = sentence_transformer(bundled_model)
    query = model.encode([QUERY])[0]
    with torch.inference_mode():
        windows = [
            model({key: torch.tensor([value]) for key, value in window.items()})["sentence_embedding"][0].numpy()
            for window in windows_of(bundled_model, LONG_TEXT, MAX_LEN, OVERLAP)
        ]
    expected = max(float(np.dot(query, window)) for window in windows)
    ranked = client.post(
        "/v1/rerank", json={"query": QUERY, "documents": [SHORT_TEXT, LONG_TEXT], "long_input": "chunk"}
    )
    assert ranked.status_code == 200, ranked.text
    scores = {item["index"]: item["relevance_score"] for item in ranked.json()["results"]}
    assert scores[1] == pytest.approx(expected, abs=1e-5)
    assert scores[0] == pytest.approx(float(np.dot(query, model.encode([SHORT_TEXT])[0])), abs=1e-5)
    long_query = client.post("/v1/rerank", json={"query": LONG_TEXT, "documents": ["x"], "long_input": "chunk"})
    assert long_query.status_code == 400, long_query.text
    assert "only a document is cut into windows" in long_query.json()["error"]["message"]


def test_a_cross_encoder_scores_a_long_document_by_its_best_window(cross_encoder_model: Path) -> None:
    import torch
    from transformers import AutoModelForSequenceClassification

    model = AutoModelForSequenceClassification.from_pretrained(str(cross_encoder_model)).eval()
    max_len = model.config.max_position_embeddings
    with torch.inference_mode():
        logits = [
            model(**{key: torch.tensor([value]) for key, value in window.items()}).logits[0, 0].item()
            for window in windows_of(cross_encoder_model, LONG_TEXT, max_len, 8, query=QUERY)
        ]
    assert len(logits) > 2
    expected = 1 / (1 + np.exp(-max(logits)))
    with serve_in_process(load(cross_encoder_model), long_input_overlap=8) as served:
        ranked = served.post("/v1/rerank", json={"query": QUERY, "documents": [LONG_TEXT], "long_input": "chunk"})
        assert ranked.status_code == 200, ranked.text
        assert ranked.json()["results"][0]["relevance_score"] == pytest.approx(expected, abs=1e-5)
        scored = served.post("/score", json={"queries": QUERY, "documents": [LONG_TEXT], "long_input": "chunk"})
        assert scored.status_code == 200, scored.text
        assert scored.json()["data"][0]["score"] == pytest.approx(expected, abs=1e-5)
        usage = scored.json()["usage"]["prompt_tokens"]
        windows = windows_of(cross_encoder_model, LONG_TEXT, max_len, 8, query=QUERY)
        assert usage == sum(len(window["input_ids"]) for window in windows)
        long_query = served.post("/score", json={"queries": LONG_TEXT, "documents": ["x"], "long_input": "chunk"})
        assert long_query.status_code == 400, long_query.text
        assert long_query.json()["error"]["param"] == "queries"


def test_an_overlap_that_repeats_a_whole_window_is_refused_at_start(bundled_model: Path) -> None:
    with pytest.raises(LoadError, match="--long-input-overlap 254 repeats a whole window"):
        load(bundled_model, long_input_overlap=MAX_LEN - 2)


def test_classify_follows_the_servers_truncate_default_and_is_never_chunked(classifier_model: Path) -> None:
    loaded = load(classifier_model)
    max_len = loaded.card.max_model_len
    for default, status in (("truncate", 200), ("chunk", 400), ("refuse", 400)):
        with serve_in_process(loaded, long_input=default) as served:
            answer = served.post("/classify", json={"input": LONG_TEXT})
            assert answer.status_code == status, (default, answer.text)
            if status == 200:
                assert answer.json()["usage"]["prompt_tokens"] == max_len
