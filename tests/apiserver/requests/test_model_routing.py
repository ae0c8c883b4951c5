"""Several models in one API server (apiserver/requests/served_models.py): a request's `model` field picks the model and
its engine, routes without one take the default, an unknown name is a 404 in the route's style naming every model."""

from __future__ import annotations

from typing import Any

from prometheus_client import REGISTRY

from tests.apiserver.served_app import CLASSIFIER_CHANGES

RERANKER = {
    **CLASSIFIER_CHANGES, "tasks": ["score", "classify", "pool", "tokenize"], "output_size": 1, "labels": ["LABEL_0"],
    "activation": "sigmoid",
}  # fmt: skip
TWO_MODELS: dict[str, Any] = {
    "config": {"served_model_name": ["embedder", "e5"]},
    "others": [(RERANKER, {"served_model_name": ["reranker"]})],
}


def test_the_model_field_picks_the_model_and_its_engine(serve: Any) -> None:
    served = serve(**TWO_MODELS)
    embedder, reranker = (state.engine for state in served.states)
    answer = served.post("/v1/embeddings", {"input": ["hello"], "model": "e5"})
    assert answer["model"] == "embedder"  # the first of its names, as on a one-model server
    assert (len(embedder.requests), len(reranker.requests)) == (1, 0)
    ranked = served.post("/v1/rerank", {"query": "q", "documents": ["a", "b"], "model": "reranker"})
    assert ranked["model"] == "reranker"
    assert (len(embedder.requests), len(reranker.requests)) == (1, 1)


def test_a_request_without_a_model_and_tei_s_routes_take_the_default(serve: Any) -> None:
    served = serve(**TWO_MODELS)
    embedder, reranker = (state.engine for state in served.states)
    served.post("/v1/embeddings", {"input": ["hello"]})
    served.post("/embed", {"inputs": ["hello"]})
    served.post("/", {"inputs": "hello"})
    assert (len(embedder.requests), len(reranker.requests)) == (3, 0)


def test_an_unknown_model_is_a_404_in_the_route_s_style_listing_every_name(serve: Any) -> None:
    served = serve(**TWO_MODELS)
    for path, body in (
        ("/v1/embeddings", {"input": "hi", "model": "nope"}),
        ("/v2/rerank", {"query": "q", "documents": ["a"], "model": "nope"}),
        ("/score", {"text_1": "a", "text_2": "b", "model": "nope"}),
        ("/tokenize", {"prompt": "a", "model": "nope"}),
    ):
        error = served.post(path, body, status=404)["error"]
        assert error["code"] == "model_not_found", (path, error)
        assert "this server serves 'embedder', 'e5', 'reranker'" in error["message"], (path, error)
    assert not any(state.engine.requests for state in served.states)


def test_a_route_the_named_model_cannot_serve_is_refused_as_on_its_own(serve: Any) -> None:
    served = serve(**TWO_MODELS)
    error = served.post("/v1/embeddings", {"input": "hi", "model": "reranker"}, status=400)["error"]
    assert error["code"] == "task_not_supported"


def test_models_info_and_health_list_every_model(serve: Any) -> None:
    served = serve(**TWO_MODELS)
    listed = served.client.get("/v1/models").json()["data"]
    assert [(entry["id"], entry["kind"]) for entry in listed] == [
        ("embedder", "embedding"), ("e5", "embedding"), ("reranker", "classifier"),
    ]  # fmt: skip
    info = served.client.get("/info").json()
    assert info["model_id"] == "embedder"
    assert [(model["model_id"], list(model["model_type"])) for model in info["models"]] == [
        ("embedder", ["embedding"]), ("reranker", ["reranker"]),
    ]  # fmt: skip
    health = served.client.get("/health/ready")
    assert health.status_code == 200 and sorted(health.json()["models"]) == ["embedder", "reranker"]


def test_one_model_answers_as_before_without_the_several_models_fields(serve: Any) -> None:
    served = serve()
    assert "models" not in served.client.get("/info").json()
    assert "models" not in served.client.get("/health/ready").json()


def count(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def test_each_model_s_request_series_are_apart_and_sum_to_the_totals(serve: Any) -> None:
    """/metrics carries the answering model's served name as `model`: one model's traffic moves its own series only,
    and a request no model answered (an unknown name) is counted with an empty one."""
    served = serve(**TWO_MODELS)
    names = ("embedder", "reranker", "")
    counted = {
        "requests": lambda m: (
            count("poolserve_requests_total", endpoint="/v1/rerank", status="200", model=m)
            + count("poolserve_requests_total", endpoint="/v1/embeddings", status="200", model=m)
        ),
        "refused": lambda m: count("poolserve_requests_total", endpoint="/v1/embeddings", status="404", model=m),
        "latency": lambda m: count("poolserve_request_duration_seconds_count", endpoint="/v1/embeddings", model=m),
        "parsing": lambda m: count("poolserve_preprocess_duration_seconds_count", endpoint="/v1/rerank", model=m),
        "rendering": lambda m: count("poolserve_encode_duration_seconds_count", endpoint="/v1/rerank", model=m),
        "tokens": lambda m: count("poolserve_prompt_tokens_total", endpoint="/v1/embeddings", model=m),
    }
    before = {(what, m): read(m) for what, read in counted.items() for m in names}
    for _ in range(3):
        served.post("/v1/embeddings", {"input": ["hello world"], "model": "e5"})  # a second name of the embedder
    for _ in range(2):
        served.post("/v1/rerank", {"query": "q", "documents": ["a", "b"], "model": "reranker"})
    served.post("/v1/embeddings", {"input": "hi", "model": "nope"}, status=404)
    moved = {key: read(key[1]) - before[key] for key in before for read in [counted[key[0]]]}
    assert {key: amount for key, amount in moved.items() if amount} == {
        ("requests", "embedder"): 3, ("requests", "reranker"): 2, ("refused", ""): 1,
        ("latency", "embedder"): 3, ("latency", ""): 1, ("parsing", "reranker"): 2, ("rendering", "reranker"): 2,
        ("tokens", "embedder"): 3 * len(served.tokens("hello world")),
    }  # fmt: skip
    text = served.client.get("/metrics").text
    assert 'poolserve_requests_total{endpoint="/v1/rerank",model="reranker",status="200"}' in text
