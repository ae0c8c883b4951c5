"""Every field a peer (OpenAI, vLLM, Cohere, Jina, Voyage) defines on poolserve's OpenAI/vLLM/Cohere-shaped
endpoints: implemented as the peer documents it (what reaches the engine, or the answer, is checked), or
refused with a 400 whose `param` names it. docs/api.md's compatibility tables say the same in words.
"""

from __future__ import annotations

import base64
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import pytest
import torch

from apiserver.requests.schemas.classify import ClassifyRequest
from apiserver.requests.schemas.embeddings import EmbeddingRequest
from apiserver.requests.schemas.pooling import PoolingRequest
from apiserver.requests.schemas.scoring import RerankRequest, ScoreRequest
from apiserver.requests.schemas.tokenize import DetokenizeRequest, TokenizeRequest
from poolserve.model_card import CLASSIFIER
from tests.apiserver.served_app import CLASSIFIER_CHANGES, DIM, text_row

CROSS_ENCODER: dict[str, Any] = {
    "architecture": "BertForSequenceClassification", "kind": CLASSIFIER, "tasks": ["score", "pool", "tokenize"],
    "output_size": 1, "labels": ["LABEL_0"], "activation": "sigmoid",
}  # fmt: skip
LONG = "one two three four five six seven eight nine ten"

API_DOC = Path(__file__).resolve().parents[3] / "docs" / "api.md"


@dataclass(frozen=True)
class Target:
    """An endpoint a compatibility table describes: its request type, and a request to add a field to."""

    path: str
    request: type[msgspec.Struct]
    body: dict[str, Any]
    card: dict[str, Any] = field(default_factory=dict)


# docs/api.md's compatibility tables, by the line that opens each. A row whose peer cell names one of
# the paths, e.g. "Voyage (/v1/embeddings)", is about that endpoint alone.
FAMILIES = {
    "/v1/embeddings and /pooling:": [
        Target("/v1/embeddings", EmbeddingRequest, {"input": "hi"}),
        Target("/pooling", PoolingRequest, {"input": "hi"}),
    ],
    "/score, /v1/score:": [Target("/v1/score", ScoreRequest, {"text_1": "a", "text_2": "b"})],
    "/rerank, /v1/rerank, /v2/rerank:": [Target("/v1/rerank", RerankRequest, {"query": "a", "documents": ["b"]})],
    "/classify:": [Target("/classify", ClassifyRequest, {"input": "hi"}, CLASSIFIER_CHANGES)],
    "/tokenize, /detokenize (vLLM's form; TEI's is in \"Compatibility: TEI\" below):": [
        Target("/tokenize", TokenizeRequest, {"prompt": "hi"}),
        Target("/detokenize", DetokenizeRequest, {"tokens": [101]}),
    ],
}


def compatibility_rows() -> list[tuple[list[Target], list[str], str]]:
    """(the endpoints, fields, what poolserve does) of every row of docs/api.md's compatibility tables."""
    section = API_DOC.read_text().split("## Compatibility", 1)[1].split("\n## ", 1)[0]
    rows: list[tuple[list[Target], list[str], str]] = []
    family = ""
    for line in section.splitlines():
        if line in FAMILIES:
            family = line
        elif family and line.startswith("| `"):
            fields, peer, does = (cell.strip() for cell in line.strip("|").split("|")[:3])
            targets = [t for t in FAMILIES[family] if f"({t.path}" in peer] or FAMILIES[family]
            rows.append((targets, re.findall(r"`([a-z_0-9]+)`", fields), does))
    return rows


def test_the_compatibility_tables_say_what_the_request_types_do() -> None:
    rows = compatibility_rows()
    assert {targets[0].path for targets, _, _ in rows} >= {targets[0].path for targets in FAMILIES.values()}
    for targets, fields, does in rows:
        for target in targets:
            for name in fields:
                # "refused": unknown to the request type, which forbid_unknown_fields turns into a 400 naming it.
                assert (name in target.request.__struct_fields__) != does.startswith("refused"), (target, name)


REFUSED = [
    (target.path, target.body, name, target.card)
    for targets, fields, does in compatibility_rows()
    if does.startswith("refused")
    for target in targets
    for name in fields
]


@pytest.mark.parametrize(("path", "body", "name", "card"), REFUSED)
def test_a_peers_field_this_server_lacks_is_a_400_naming_it(
    serve: Any, path: str, body: dict[str, Any], name: str, card: dict[str, Any]
) -> None:
    served = serve(card=card)
    error = served.post(path, {**body, name: "x"}, status=400)["error"]
    assert error["param"] == name and name in error["message"]
    assert served.engine.requests == []


# A value outside the field's set, and the set's values refused by name.
BAD_VALUES = [
    ("/v1/embeddings", {"input": "hi", "encoding_format": "base64"}, "embed_dtype", "int4"),
    ("/pooling", {"input": "hi"}, "embed_dtype", "fp8"),
    ("/v1/embeddings", {"input": "hi"}, "endianness", "middle"),
    ("/pooling", {"input": "hi", "encoding_format": "base64"}, "endianness", "BIG"),
    ("/v1/embeddings", {"input": "hi"}, "encoding_format", "bytes"),
    ("/v1/embeddings", {"input": "hi"}, "use_activation", "yes"),
    ("/v1/embeddings", {"input": "hi"}, "add_special_tokens", 0),
    ("/v1/embeddings", {"input": "hi"}, "truncation_side", "middle"),
    ("/v1/embeddings", {"input": "hi"}, "output_dtype", "int8"),
    ("/v1/embeddings", {"input": "hi"}, "output_dtype", "uint8"),
    ("/v1/embeddings", {"input": "hi"}, "output_dtype", "float16"),
    ("/v1/embeddings", {"input": "hi"}, "output_dimension", 0),
    ("/v1/embeddings", {"input": "hi"}, "output_dimension", DIM + 1),
    ("/v1/embeddings", {"input": "hi"}, "truncation", "yes"),
    ("/v1/embeddings", {"input": "hi", "dimensions": 4, "output_dtype": "binary"}, "output_dtype", "binary"),
    ("/v2/rerank", {"query": "a", "documents": ["b"]}, "max_tokens_per_doc", 0),
    ("/score", {"text_1": "a", "text_2": "b"}, "use_activation", "no"),
    # A classifier's option to an embedding model changes nothing: refused (classifiers: below).
    ("/pooling", {"input": "hi"}, "activation", False),
    # A sparse model's pruning asked of a dense one; and out of its range.
    ("/pooling", {"input": "hi"}, "sparse_top_k", 3),
    ("/pooling", {"input": "hi"}, "sparse_threshold", 0.5),
    ("/pooling", {"input": "hi"}, "sparse_top_k", 0),
    ("/pooling", {"input": "hi"}, "sparse_threshold", -0.5),
]


@pytest.mark.parametrize(
    ("form", "name", "value"),
    [
        ("documents", "raw_scores", True), ("documents", "return_text", True), ("documents", "truncate", True),
        ("documents", "truncation_direction", "Left"), ("texts", "truncate_prompt_tokens", -1),
        ("texts", "truncation_side", "left"), ("texts", "return_documents", False),
    ],
)  # fmt: skip
def test_an_option_of_the_other_rerank_form_is_refused_by_name(serve: Any, form: str, name: str, value: object) -> None:
    served = serve()
    body = {"query": "a", form: ["b"], name: value}
    if form == "texts":  # TEI's form gets TEI's refusal of a value: 413 Validation, the field in the message
        error = served.post("/rerank", body, status=413)
        assert error["error_type"] == "Validation" and f"`{name}`" in error["error"]
    else:
        assert served.post("/rerank", body, status=400)["error"]["param"] == name


@pytest.mark.parametrize(("name", "value"), [("normalize", False), ("dimensions", 2)])
def test_an_embedding_models_option_to_a_classifier_is_a_400_naming_it(serve: Any, name: str, value: object) -> None:
    served = serve(card=CLASSIFIER_CHANGES)
    assert served.post("/pooling", {"input": "hi", name: value}, status=400)["error"]["param"] == name


@pytest.mark.parametrize(("path", "body", "name", "value"), BAD_VALUES)
def test_a_value_outside_a_fields_set_is_a_400_naming_the_field(
    serve: Any, path: str, body: dict[str, Any], name: str, value: object
) -> None:
    served = serve()
    error = served.post(path, {**body, name: value}, status=400)["error"]
    assert error["param"] == name, error
    assert served.engine.requests == []


# Two spellings of one field in one request.
SPELLINGS = [
    ("/v1/embeddings", {"input": "hi", "normalize": True, "use_activation": True}, "use_activation", {}),
    ("/v1/embeddings", {"input": "hi", "dimensions": 4, "output_dimension": 4}, "output_dimension", {}),
    ("/v1/embeddings", {"input": "hi", "truncate_prompt_tokens": 4, "truncation": True}, "truncation", {}),
    ("/pooling", {"input": "hi", "activation": False, "use_activation": False}, "activation", CLASSIFIER_CHANGES),
    ("/classify", {"input": "hi", "activation": False, "use_activation": False}, "activation", CLASSIFIER_CHANGES),
    ("/score", {"text_1": "a", "queries": "a", "text_2": "b"}, "text_1", {}),
    ("/score", {"queries": "a", "documents": "b", "items": "b"}, "items", {}),
    ("/score", {"queries": "a", "data_2": "b"}, "data_2", {}),
    ("/score", {"text_1": "a"}, "text_2", {}),
    ("/score", {"documents": "a"}, "queries", {}),
    ("/rerank", {"query": "a", "documents": ["b"], "use_activation": True, "activation": True}, "activation", {}),
    ("/rerank", {"query": "a", "texts": ["b"], "raw_scores": True, "use_activation": True}, "raw_scores", {}),
]


@pytest.mark.parametrize(("path", "body", "param", "card"), SPELLINGS)
def test_two_spellings_of_one_field_are_a_400_naming_them(
    serve: Any, path: str, body: dict[str, Any], param: str, card: dict[str, Any]
) -> None:
    served = serve(card=card)
    if "texts" in body:  # TEI's form gets TEI's refusal of a value: 413 Validation, the fields in the message
        tei_error = served.post(path, body, status=413)
        assert tei_error["error_type"] == "Validation" and f"`{param}`" in tei_error["error"]
        return
    error = served.post(path, body, status=400)["error"]
    assert error["param"] == param, error
    assert f"`{param}`" in error["message"]


@pytest.mark.parametrize("path", ["/v1/embeddings", "/pooling"])
@pytest.mark.parametrize(
    ("embed_dtype", "dtype"),
    [("float32", "f4"), ("float16", "f2"), ("bfloat16", "bf16"), ("fp8_e4m3", "e4m3"), ("fp8_e5m2", "e5m2")],
)
@pytest.mark.parametrize("endianness", ["native", "little", "big"])
def test_base64_vectors_come_in_vllms_dtype_and_byte_order(
    serve: Any, path: str, embed_dtype: str, dtype: str, endianness: str
) -> None:
    served = serve()
    options = {"embed_dtype": embed_dtype, "endianness": endianness}
    body = served.post(path, {"input": "hello", "encoding_format": "base64", **options})
    key = "embedding" if path == "/v1/embeddings" else "data"
    raw = base64.b64decode(body["data"][0][key])
    order = ">" if endianness == "big" else "<"
    if dtype == "bf16":
        values = (np.frombuffer(raw, dtype=f"{order}u2").astype(np.uint32) << 16).view(np.float32)
    elif dtype in ("e4m3", "e5m2"):
        float8 = torch.float8_e4m3fn if dtype == "e4m3" else torch.float8_e5m2
        values = torch.frombuffer(bytearray(raw), dtype=torch.uint8).view(float8).float().numpy()
    else:
        values = np.frombuffer(raw, dtype=f"{order}{dtype}")
    expected = np.asarray(text_row(served.tokens("hello"), DIM), dtype=np.float32)
    # As in vLLM, the two options are about bytes: JSON floats stay float32 values.
    floats = served.post(path, {"input": "hello", **options})["data"][0][key]
    assert floats == expected.tolist()
    if dtype == "e4m3":  # torch saturates fp8_e4m3 at its largest value
        expected = np.clip(expected, -448, 448)
    precision = {"f4": 0, "f2": 1e-3, "bf16": 8e-3, "e4m3": 0.07, "e5m2": 0.13}[dtype]
    np.testing.assert_allclose(values, expected, rtol=precision)


def test_use_activation_is_normalization_for_embeddings_and_activation_for_classifiers(serve: Any) -> None:
    served = serve()
    for path in ("/v1/embeddings", "/pooling"):
        served.post(path, {"input": "hi", "use_activation": False})
        assert served.engine.requests[-1].params.normalize is False
        served.post(path, {"input": "hi"})
        assert served.engine.requests[-1].params.normalize is None  # the model's own choice
    served.post("/pooling", {"input": "hi", "use_activation": False})
    assert served.engine.requests[-1].params.activation is False
    classifier = serve(card=CLASSIFIER_CHANGES)
    for name in ("use_activation", "activation"):
        for path in ("/classify", "/pooling"):
            classifier.post(path, {"input": "hi", name: False})
            assert classifier.engine.requests[-1].params.activation is False
            classifier.post(path, {"input": "hi", name: True})
            assert classifier.engine.requests[-1].params.activation is True


@pytest.mark.parametrize("name", ["use_activation", "activation"])
def test_score_and_rerank_honour_both_activation_spellings(serve: Any, name: str) -> None:
    served = serve(card=CROSS_ENCODER)
    cases = [
        ("/score", {"text_1": "a", "text_2": "b"}),
        ("/rerank", {"query": "a", "documents": ["b"]}),
        ("/v1/rerank", {"query": "a", "documents": ["b"]}),
        ("/v2/rerank", {"query": "a", "documents": ["b"]}),
        ("/rerank", {"query": "a", "texts": ["b"]}),
    ]
    for path, body in cases:
        served.post(path, {**body, name: False})
        assert served.engine.requests[-1].params.activation is False, path
        served.post(path, body)
        assert served.engine.requests[-1].params.activation is True, path


@pytest.mark.parametrize(
    ("path", "card"), [("/v1/embeddings", {}), ("/pooling", {}), ("/classify", CLASSIFIER_CHANGES)]
)
def test_add_special_tokens_false_sends_the_texts_own_tokens(serve: Any, path: str, card: dict[str, Any]) -> None:
    served = serve(card={**card, "max_model_len": 16})
    tokenizer = served.state.tokenizer
    long = "word " * 3000  # past a tokenization window: tokenized from its start only
    served.post(path, {"input": ["hello world", long], "add_special_tokens": False, "truncate_prompt_tokens": 5})
    sent = served.engine.requests[-1]
    assert sent.lengths == [2, 5]
    served.post(path, {"input": ["hello world", long], "truncate_prompt_tokens": 5, "truncation_side": "left"})
    assert served.engine.requests[-1].lengths == [4, 5]
    assert tokenizer.encode(["hello world"], add_special_tokens=False) == [tokenizer.encode(["hello world"])[0][1:-1]]


def test_add_special_tokens_false_keeps_the_limit_to_the_texts_tokens(serve: Any) -> None:
    served = serve(card={"max_model_len": 8})
    tokenizer = served.state.tokenizer
    ids = tokenizer.encode([LONG], add_special_tokens=False)[0]
    body = served.post("/v1/embeddings", {"input": LONG, "add_special_tokens": False, "truncate_prompt_tokens": -1})
    assert body["data"][0]["embedding"] == text_row(ids[:8], DIM)
    left = served.post("/v1/embeddings", {"input": LONG, "truncate_prompt_tokens": 4, "truncation_side": "left"})
    assert left["data"][0]["embedding"] == text_row(tokenizer.encode_truncated(LONG, 4, "left"), DIM)


def test_score_answers_the_same_under_each_of_vllms_spellings(serve: Any) -> None:
    served = serve(card=CROSS_ENCODER)
    answers = [
        served.post("/score", {first: "a cat", second: ["a kitten", "a dog"]})["data"]
        for first, second in (
            ("queries", "documents"),
            ("queries", "items"),
            ("data_1", "data_2"),
            ("text_1", "text_2"),
        )
    ]
    assert all([d["score"] for d in answer] == [d["score"] for d in answers[0]] for answer in answers)
    error = served.post("/score", {"queries": "a", "documents": ["b", ""]}, status=400)["error"]
    assert error["param"] == "documents[1]"


@pytest.mark.parametrize("card", [CROSS_ENCODER, {}])
def test_max_tokens_per_doc_cuts_each_document_as_cohere_does(serve: Any, card: dict[str, Any]) -> None:
    served = serve(card=card)
    tokenizer = served.state.tokenizer
    documents = [LONG, "short one", "word " * 3000]
    body = served.post("/v2/rerank", {"query": "q", "documents": documents, "max_tokens_per_doc": 3})
    cut = [tokenizer.encode([d], add_special_tokens=False)[0][:3] for d in documents]
    sent = served.engine.requests[-1]
    if card:  # a cross-encoder reads [CLS] q [SEP] doc[:3] [SEP]
        assert sent.lengths == [3 + len(c) + 1 for c in cut]
    else:  # a bi-encoder embeds the query and each cut document
        assert sent.lengths == [3, *(2 + len(c) for c in cut)]
    assert sorted(r["index"] for r in body["results"]) == [0, 1, 2]
    assert body["results"][0]["document"]["text"] in documents  # the answer names the document as sent
    hidden = served.post("/v2/rerank", {"query": "q", "documents": documents[:2], "return_documents": False})
    assert all("document" not in r or r["document"] is None for r in hidden["results"])


def test_voyages_fields_map_onto_openais(serve: Any) -> None:
    served = serve(card={"max_model_len": 8})
    row = text_row(served.tokens("hi"), DIM)
    body = served.post("/v1/embeddings", {"input": "hi", "output_dimension": 4, "input_type": None})
    assert served.engine.requests[-1].params.dimensions == 4 and body["data"][0]["embedding"] == row[:4]
    assert served.post("/v1/embeddings", {"input": LONG, "truncation": True})["usage"]["prompt_tokens"] == 8
    error = served.post("/v1/embeddings", {"input": LONG, "truncation": False}, status=400)["error"]
    assert error["code"] == "context_length_exceeded"
    signs = np.asarray(row) > 0
    ubinary = served.post("/v1/embeddings", {"input": "hi", "output_dtype": "ubinary"})["data"][0]["embedding"]
    assert ubinary == np.packbits(signs).tolist()
    binary = served.post("/v1/embeddings", {"input": "hi", "output_dtype": "binary"})["data"][0]["embedding"]
    assert binary == [b - 128 for b in ubinary]
    packed = served.post("/v1/embeddings", {"input": "hi", "output_dtype": "binary", "encoding_format": "base64"})
    assert np.frombuffer(base64.b64decode(packed["data"][0]["embedding"]), dtype=np.int8).tolist() == binary


def test_user_is_accepted_and_shown_in_the_access_log(serve: Any) -> None:
    from apiserver.connection.telemetry import user_field

    served = serve()
    for path, body in [("/v1/embeddings", {"input": "hi"}), ("/score", {"text_1": "a", "text_2": "b"})]:
        served.post(path, {**body, "user": "user-1234"})
    assert user_field('a"\nb') == ' user="a\\"\\nb"'
    assert user_field(None) == ""
