"""Cross-encoders and classifiers served for real: scores and labels equal a direct transformers forward."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import torch
from transformers import AutoModelForSequenceClassification, AutoTokenizer

from tests.in_process.stack_server import InProcessServer

QUERY = "what is the capital of france?"
DOCUMENTS = [
    "Paris is the capital and most populous city of France.",
    "The Eiffel Tower was completed in 1889.",
    "Berlin is the capital of Germany.",
    "France borders Spain, Italy, Germany and Belgium.",
    "Croissants are a French pastry.",
]
TEXTS = ["I love this product! Five stars.", "Terrible service, I will never come back.", "It arrived on Tuesday."]


def direct_logits(folder: Path, first: list[str], second: list[str] | None = None) -> np.ndarray:
    """The same model run by transformers itself, one input at a time (no padding involved)."""
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForSequenceClassification.from_pretrained(folder).eval()
    rows = []
    with torch.inference_mode():
        for i, text in enumerate(first):
            encoded = tokenizer(text, second[i] if second else None, return_tensors="pt")
            rows.append(model(**encoded).logits[0].numpy())
    return np.stack(rows)


def post(client: httpx.Client, path: str, body: dict[str, Any]) -> Any:
    response = client.post(path, json=body)
    assert response.status_code == 200, response.text
    return response.json()


@pytest.fixture
def cross_encoder(cross_encoder_server: InProcessServer) -> Iterator[httpx.Client]:
    with cross_encoder_server.client() as client:
        yield client


@pytest.fixture
def classifier(classifier_server: InProcessServer) -> Iterator[httpx.Client]:
    with classifier_server.client() as client:
        yield client


@pytest.fixture(scope="module")
def pair_scores(cross_encoder_model: Path) -> np.ndarray:
    logits = direct_logits(cross_encoder_model, [QUERY] * len(DOCUMENTS), DOCUMENTS)
    return torch.sigmoid(torch.from_numpy(logits[:, 0])).numpy()  # type: ignore[no-any-return]


def test_score_one_to_one_one_to_many_and_many_to_many(
    cross_encoder: httpx.Client, cross_encoder_model: Path, pair_scores: np.ndarray
) -> None:
    one = post(cross_encoder, "/score", {"text_1": QUERY, "text_2": DOCUMENTS[0]})
    assert [d["index"] for d in one["data"]] == [0]
    np.testing.assert_allclose(one["data"][0]["score"], pair_scores[0], atol=1e-5)
    many = post(cross_encoder, "/score", {"text_1": QUERY, "text_2": DOCUMENTS})
    np.testing.assert_allclose([d["score"] for d in many["data"]], pair_scores, atol=1e-5)
    assert many["object"] == "list" and many["id"].startswith("score-")
    assert many["usage"]["prompt_tokens"] > 0
    firsts = [QUERY, "Where is Berlin?", "pastry", "towers", "borders"]
    zipped = post(cross_encoder, "/score", {"text_1": firsts, "text_2": DOCUMENTS})
    expected = torch.sigmoid(torch.from_numpy(direct_logits(cross_encoder_model, firsts, DOCUMENTS)[:, 0])).numpy()
    np.testing.assert_allclose([d["score"] for d in zipped["data"]], expected, atol=1e-5)


def test_score_without_activation_gives_the_logit(cross_encoder: httpx.Client, cross_encoder_model: Path) -> None:
    raw = post(cross_encoder, "/score", {"text_1": QUERY, "text_2": DOCUMENTS, "activation": False})
    expected = direct_logits(cross_encoder_model, [QUERY] * len(DOCUMENTS), DOCUMENTS)[:, 0]
    np.testing.assert_allclose([d["score"] for d in raw["data"]], expected, atol=1e-5)


@pytest.mark.parametrize("path", ["/rerank", "/v1/rerank", "/v2/rerank"])
def test_rerank_orders_documents_by_score(cross_encoder: httpx.Client, pair_scores: np.ndarray, path: str) -> None:
    body = post(cross_encoder, path, {"query": QUERY, "documents": DOCUMENTS, "top_n": 3})
    order = list(np.argsort(-pair_scores, kind="stable")[:3])
    assert [r["index"] for r in body["results"]] == order
    np.testing.assert_allclose([r["relevance_score"] for r in body["results"]], pair_scores[order], atol=1e-5)
    assert [r["document"]["text"] for r in body["results"]] == [DOCUMENTS[i] for i in order]
    assert body["id"].startswith("rerank-") and body["usage"]["total_tokens"] > 0


def test_rerank_without_documents_in_the_answer_and_with_document_objects(cross_encoder: httpx.Client) -> None:
    documents = [{"text": d} for d in DOCUMENTS]
    body = post(cross_encoder, "/v1/rerank", {"query": QUERY, "documents": documents, "return_documents": False})
    assert len(body["results"]) == len(DOCUMENTS)
    assert all(r["document"] is None for r in body["results"])
    scores = [r["relevance_score"] for r in body["results"]]
    assert scores == sorted(scores, reverse=True)


def test_tei_rerank_with_texts(cross_encoder: httpx.Client, cross_encoder_model: Path, pair_scores: np.ndarray) -> None:
    body = post(cross_encoder, "/rerank", {"query": QUERY, "texts": DOCUMENTS, "return_text": True})
    order = list(np.argsort(-pair_scores, kind="stable"))
    assert [r["index"] for r in body] == order
    assert [r["text"] for r in body] == [DOCUMENTS[i] for i in order]
    np.testing.assert_allclose([r["score"] for r in body], pair_scores[order], atol=1e-5)
    raw = post(cross_encoder, "/rerank", {"query": QUERY, "texts": DOCUMENTS, "raw_scores": True})
    logits = direct_logits(cross_encoder_model, [QUERY] * len(DOCUMENTS), DOCUMENTS)[:, 0]
    np.testing.assert_allclose(sorted(r["score"] for r in raw), sorted(logits), atol=1e-5)
    assert all("text" not in r for r in raw)


def test_tei_predict_on_a_pair_and_a_batch(cross_encoder: httpx.Client, pair_scores: np.ndarray) -> None:
    single = post(cross_encoder, "/predict", {"inputs": [QUERY, DOCUMENTS[0]]})
    assert single[0]["label"] == "LABEL_0"
    np.testing.assert_allclose(single[0]["score"], pair_scores[0], atol=1e-5)
    batch = post(cross_encoder, "/predict", {"inputs": [[QUERY, d] for d in DOCUMENTS[:2]]})
    np.testing.assert_allclose([p[0]["score"] for p in batch], pair_scores[:2], atol=1e-5)


def test_cross_encoder_info_and_refusals(cross_encoder: httpx.Client) -> None:
    info = cross_encoder.get("/info").json()
    assert info["model_type"] == {"reranker": {"id2label": {"0": "LABEL_0"}, "label2id": {"LABEL_0": 0}}}
    assert info["max_input_length"] == 128
    refused = cross_encoder.post("/v1/embeddings", json={"input": "hello"})
    assert refused.status_code == 400
    assert refused.json()["error"]["code"] == "task_not_supported"


def test_long_pairs_are_refused_unless_truncated(cross_encoder: httpx.Client) -> None:
    long_document = "word " * 200
    refused = cross_encoder.post("/score", json={"text_1": QUERY, "text_2": long_document})
    assert refused.status_code == 400
    assert refused.json()["error"]["code"] == "context_length_exceeded"
    cut = post(cross_encoder, "/score", {"text_1": QUERY, "text_2": long_document, "truncate_prompt_tokens": -1})
    assert 0 <= cut["data"][0]["score"] <= 1
    assert cut["usage"]["prompt_tokens"] == 128


def test_classify_equals_a_direct_softmax(classifier: httpx.Client, classifier_model: Path) -> None:
    body = post(classifier, "/classify", {"input": TEXTS})
    probs = torch.softmax(torch.from_numpy(direct_logits(classifier_model, TEXTS)), dim=-1).numpy()
    labels = ["negative", "neutral", "positive"]
    assert [d["index"] for d in body["data"]] == [0, 1, 2]
    for item, expected in zip(body["data"], probs, strict=True):
        np.testing.assert_allclose(item["probs"], expected, atol=1e-5)
        assert item["label"] == labels[int(expected.argmax())]
        assert item["num_classes"] == 3
    assert body["id"].startswith("classify-")


def test_tei_predict_lists_every_label_best_first(classifier: httpx.Client, classifier_model: Path) -> None:
    probs = torch.softmax(torch.from_numpy(direct_logits(classifier_model, TEXTS)), dim=-1).numpy()
    single = post(classifier, "/predict", {"inputs": TEXTS[0]})
    assert [p["score"] for p in single] == sorted((p["score"] for p in single), reverse=True)
    np.testing.assert_allclose(sorted(p["score"] for p in single), sorted(probs[0]), atol=1e-5)
    batch = post(classifier, "/predict", {"inputs": TEXTS})
    assert len(batch) == 3 and all(len(p) == 3 for p in batch)
    raw = post(classifier, "/predict", {"inputs": TEXTS[1], "raw_scores": True})
    logits = direct_logits(classifier_model, TEXTS[1:2])[0]
    np.testing.assert_allclose(sorted(p["score"] for p in raw), sorted(logits), atol=1e-5)


def test_pooling_on_a_classifier_gives_probabilities_or_logits(
    classifier: httpx.Client, classifier_model: Path
) -> None:
    logits = direct_logits(classifier_model, TEXTS[:2])
    probs = post(classifier, "/pooling", {"input": TEXTS[:2]})
    np.testing.assert_allclose(
        [d["data"] for d in probs["data"]], torch.softmax(torch.from_numpy(logits), -1), atol=1e-5
    )
    raw = post(classifier, "/pooling", {"input": TEXTS[:2], "activation": False})
    np.testing.assert_allclose([d["data"] for d in raw["data"]], logits, atol=1e-5)


def test_classifier_info_and_refusals(classifier: httpx.Client) -> None:
    info = classifier.get("/info").json()
    assert info["model_type"]["classifier"]["id2label"] == {"0": "negative", "1": "neutral", "2": "positive"}
    for path, body in (("/score", {"text_1": "a", "text_2": "b"}), ("/rerank", {"query": "a", "documents": ["b"]})):
        response = classifier.post(path, json=body)
        assert response.status_code == 400
        assert "classify" in response.json()["error"]["message"]


@pytest.mark.parametrize(("path", "name"), [("/rerank", "use_activation"), ("/v2/rerank", "activation")])
def test_rerank_without_activation_gives_the_logits_under_either_name(
    cross_encoder: httpx.Client, cross_encoder_model: Path, path: str, name: str
) -> None:
    body = post(cross_encoder, path, {"query": QUERY, "documents": DOCUMENTS, name: False})
    expected = direct_logits(cross_encoder_model, [QUERY] * len(DOCUMENTS), DOCUMENTS)[:, 0]
    by_index = {r["index"]: r["relevance_score"] for r in body["results"]}
    np.testing.assert_allclose([by_index[i] for i in range(len(DOCUMENTS))], expected, atol=1e-5)
    scored = post(cross_encoder, "/score", {"queries": QUERY, "documents": DOCUMENTS, "use_activation": False})
    np.testing.assert_allclose([d["score"] for d in scored["data"]], expected, atol=1e-5)


def test_max_tokens_per_doc_scores_each_document_cut_to_its_first_tokens(
    cross_encoder: httpx.Client, cross_encoder_model: Path
) -> None:
    body = post(cross_encoder, "/v2/rerank", {"query": QUERY, "documents": DOCUMENTS, "max_tokens_per_doc": 3})
    tokenizer = AutoTokenizer.from_pretrained(cross_encoder_model)
    model = AutoModelForSequenceClassification.from_pretrained(cross_encoder_model).eval()
    query = tokenizer(QUERY, add_special_tokens=False)["input_ids"]
    cls, sep = tokenizer.cls_token_id, tokenizer.sep_token_id
    expected = []
    with torch.inference_mode():
        for document in DOCUMENTS:
            cut = tokenizer(document, add_special_tokens=False)["input_ids"][:3]
            ids = torch.tensor([[cls, *query, sep, *cut, sep]])
            types = torch.tensor([[0] * (len(query) + 2) + [1] * (len(cut) + 1)])
            expected.append(torch.sigmoid(model(input_ids=ids, token_type_ids=types).logits[0, 0]).item())
    by_index = {r["index"]: r["relevance_score"] for r in body["results"]}
    np.testing.assert_allclose([by_index[i] for i in range(len(DOCUMENTS))], expected, atol=1e-5)
    assert body["usage"]["prompt_tokens"] == len(DOCUMENTS) * (len(query) + 6)


def test_classify_without_activation_gives_the_logits(classifier: httpx.Client, classifier_model: Path) -> None:
    raw = post(classifier, "/classify", {"input": TEXTS, "use_activation": False})
    np.testing.assert_allclose([d["probs"] for d in raw["data"]], direct_logits(classifier_model, TEXTS), atol=1e-5)


def test_post_root_and_invocations_rank_on_a_cross_encoder_and_predict_on_a_classifier(
    cross_encoder: httpx.Client, classifier: httpx.Client
) -> None:
    """TEI's routing of POST / (and SageMaker's /invocations) by the model's kind."""
    ranking = {"query": QUERY, "texts": DOCUMENTS}
    expected = post(cross_encoder, "/rerank", ranking)
    assert post(cross_encoder, "/", ranking) == post(cross_encoder, "/invocations", ranking) == expected
    prediction = {"inputs": TEXTS}
    expected = post(classifier, "/predict", prediction)
    assert post(classifier, "/", prediction) == post(classifier, "/invocations", prediction) == expected
    refused = classifier.post("/embed_all", json={"inputs": "hi"})
    assert refused.status_code == 424 and refused.json()["error_type"] == "Backend"


def test_huggingface_hubs_text_classification_with_the_bare_url(
    classifier: httpx.Client, classifier_server: InProcessServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    import huggingface_hub.constants
    from huggingface_hub import InferenceClient

    # huggingface_hub refuses every request while HF_HUB_OFFLINE is set, even to a local server.
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    best = post(classifier, "/predict", {"inputs": TEXTS[0]})[0]
    # The client takes the first element of TEI's answer, the best label.
    answer = InferenceClient(model=classifier_server.url).text_classification(TEXTS[0])
    assert (answer.label, answer.score) == (best["label"], pytest.approx(best["score"], abs=1e-6))
