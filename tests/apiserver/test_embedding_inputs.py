from __future__ import annotations

from pathlib import Path

import msgspec
import numpy as np
import pytest

from apiserver.embedding_inputs import (
    check_model,
    decode_embedding_request,
    tokenize_embedding_request,
)
from apiserver.errors import ApiError
from apiserver.schemas.embeddings import EmbeddingRequest
from apiserver.tokenizer import TextTokenizer
from tests.engine_core.test_protocol import CARD


@pytest.fixture(scope="module")
def tokenizer(bundled_model: Path) -> TextTokenizer:
    return TextTokenizer((bundled_model / "tokenizer.json").read_text())


def tokenize(body: object, tokenizer: TextTokenizer):  # type: ignore[no-untyped-def]
    request = decode_embedding_request(msgspec.json.encode(body))
    return tokenize_embedding_request(request, tokenizer, CARD)


def rows(inputs) -> list[list[int]]:  # type: ignore[no-untyped-def]
    flat = np.frombuffer(inputs.tokens, dtype="<i4").tolist()
    out, start = [], 0
    for n in inputs.lengths:
        out.append(flat[start : start + n])
        start += n
    return out


def test_every_input_shape_openai_accepts(tokenizer: TextTokenizer) -> None:
    assert rows(tokenize({"input": "hello"}, tokenizer)) == [[101, 7592, 102]]
    assert rows(tokenize({"input": ["hello", "hello world"]}, tokenizer)) == [
        [101, 7592, 102],
        [101, 7592, 2088, 102],
    ]
    assert rows(tokenize({"input": [101, 7592, 102]}, tokenizer)) == [[101, 7592, 102]]
    assert rows(tokenize({"input": [[101, 102], [7592]]}, tokenizer)) == [[101, 102], [7592]]


def test_usage_counts_the_tokens_sent_to_the_model(tokenizer: TextTokenizer) -> None:
    assert tokenize({"input": ["hello", "hello world"]}, tokenizer).prompt_tokens == 7


def test_unknown_fields_are_ignored_like_openai_extensions(tokenizer: TextTokenizer) -> None:
    assert tokenize({"input": "hi", "extra_body_field": 1}, tokenizer).lengths == [3]


@pytest.mark.parametrize(
    ("body", "status", "param"),
    [
        ({}, 400, None),
        ({"input": []}, 400, "input"),
        ({"input": ""}, 400, "input[0]"),
        ({"input": ["a", ""]}, 400, "input[1]"),
        ({"input": ["a", 1]}, 400, "input[1]"),
        ({"input": [1, "a"]}, 400, "input"),
        ({"input": [[1], 2]}, 400, "input[1]"),
        ({"input": [[]]}, 400, "input[0]"),
        ({"input": [True]}, 400, "input[0]"),
        ({"input": {"text": "a"}}, 400, "input"),
        ({"input": 5}, 400, "input"),
        ({"input": "a", "encoding_format": "int8"}, 400, "encoding_format"),
        ({"input": "a", "dimensions": 0}, 400, "dimensions"),
        ({"input": "a", "dimensions": 385}, 400, "dimensions"),
        ({"input": "a", "dimensions": "8"}, 400, "dimensions"),
        ({"input": "a", "truncate_prompt_tokens": -2}, 400, "truncate_prompt_tokens"),
        ({"input": "a", "truncate_prompt_tokens": 0}, 400, "truncate_prompt_tokens"),
        ({"input": "a", "truncate_prompt_tokens": 257}, 400, "truncate_prompt_tokens"),
        ({"input": "a", "truncate_prompt_tokens": 2}, 400, "truncate_prompt_tokens"),
        ({"input": [[1, 30522]]}, 400, "input[0]"),
        ({"input": [[-1]]}, 400, "input[0]"),
        ({"input": [[2**70]]}, 400, "input[0]"),
        ({"input": "word " * 300}, 400, "input[0]"),
        ({"input": [[5] * 257]}, 400, "input[0]"),
        ({"input": "a", "model": 3}, 400, "model"),
    ],
)
def test_bad_input_is_a_400_naming_the_field(
    body: object, status: int, param: str | None, tokenizer: TextTokenizer
) -> None:
    with pytest.raises(ApiError) as caught:
        tokenize(body, tokenizer)
    assert caught.value.status == status
    assert caught.value.param == param, caught.value.message


@pytest.mark.parametrize("body", [b"", b"{", b"not json", b'{"input": "a",}', b"\xff\xfe"])
def test_malformed_json_is_a_400(body: bytes) -> None:
    with pytest.raises(ApiError) as caught:
        decode_embedding_request(body)
    assert caught.value.status == 400
    assert "JSON" in caught.value.message


def test_too_long_input_says_how_long_and_how_to_fix_it(tokenizer: TextTokenizer) -> None:
    with pytest.raises(ApiError) as caught:
        tokenize({"input": ["ok", "word " * 300]}, tokenizer)
    assert caught.value.code == "context_length_exceeded"
    assert "302 tokens" in caught.value.message
    assert "256" in caught.value.message
    assert "truncate_prompt_tokens" in caught.value.message


def test_truncation_on_request(tokenizer: TextTokenizer) -> None:
    long_text = "word " * 300
    assert tokenize({"input": long_text, "truncate_prompt_tokens": -1}, tokenizer).lengths == [256]
    cut = rows(tokenize({"input": long_text, "truncate_prompt_tokens": 5}, tokenizer))
    assert cut == [[101, 2773, 2773, 2773, 102]]
    assert rows(tokenize({"input": [list(range(1000, 1300))], "truncate_prompt_tokens": 4}, tokenizer)) == [
        [1000, 1001, 1002, 1003]
    ]
    # Inputs already within the limit are left alone.
    assert rows(tokenize({"input": "hello", "truncate_prompt_tokens": 10}, tokenizer)) == [[101, 7592, 102]]


def test_dimensions_travel_to_the_engine(tokenizer: TextTokenizer) -> None:
    assert tokenize({"input": "a", "dimensions": 64}, tokenizer).dimensions == 64
    assert tokenize({"input": "a"}, tokenizer).dimensions == 0


def test_unknown_model_is_a_404() -> None:
    check_model(None, ["m"])
    check_model("m", ["m", "alias"])
    with pytest.raises(ApiError) as caught:
        check_model("other", ["m"])
    assert (caught.value.status, caught.value.code, caught.value.param) == (404, "model_not_found", "model")


def test_request_defaults() -> None:
    request = EmbeddingRequest(input="a")
    assert (request.encoding_format, request.dimensions, request.truncate_prompt_tokens) == (
        "float",
        None,
        None,
    )
