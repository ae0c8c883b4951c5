from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import pytest

from apiserver.errors import ApiError
from apiserver.images.sources import ImageSource
from apiserver.requests.inputs.items import item_from_messages, items_from_input, request_items
from apiserver.requests.inputs.job import EngineJob, build_job
from apiserver.requests.inputs.text import resolve_token_limit
from apiserver.requests.schemas.common import ChatMessage, InputItem
from apiserver.requests.schemas.embeddings import EmbeddingRequest
from apiserver.requests.tokenizer import TextTokenizer
from apiserver.requests.validation import check_dimensions, check_model, decode_body, require_task
from poolserve.model_card import ImageProcessing
from poolserve.protocol import TOKEN_DTYPE, ClientWire, PoolingParams
from tests.cards import CARD

_decoder = msgspec.json.Decoder(EmbeddingRequest)


@pytest.fixture(scope="module")
def tokenizer(bundled_model: Path) -> TextTokenizer:
    return TextTokenizer((bundled_model / "tokenizer.json").read_text())


def tokenize(body: object, tokenizer: TextTokenizer) -> EngineJob:
    request = decode_body(msgspec.json.encode(body), _decoder)
    check_dimensions(request.dimensions, CARD)
    items = request_items(request.input, request.messages, max_items=2048)
    limit = resolve_token_limit(request.truncate_prompt_tokens, CARD)
    return build_job(items, CARD, tokenizer, limit=limit)


def as_input(value: list[object]) -> list[InputItem]:
    """What the request decoder makes of a JSON `input` list."""
    return msgspec.convert(value, type=list[InputItem])


def test_every_input_shape_openai_accepts(tokenizer: TextTokenizer) -> None:
    assert tokenize({"input": "hello"}, tokenizer).rows == [[101, 7592, 102]]
    assert tokenize({"input": ["hello", "hello world"]}, tokenizer).rows == [[101, 7592, 102], [101, 7592, 2088, 102]]
    assert tokenize({"input": [101, 7592, 102]}, tokenizer).rows == [[101, 7592, 102]]
    assert tokenize({"input": [[101, 102], [7592]]}, tokenizer).rows == [[101, 102], [7592]]


def test_messages_make_one_input_of_their_text(tokenizer: TextTokenizer) -> None:
    body = {"messages": [{"role": "user", "content": [{"type": "text", "text": "hello"}]}]}
    assert tokenize(body, tokenizer).rows == [[101, 7592, 102]]
    assert tokenize({"messages": [{"role": "user", "content": "hello"}]}, tokenizer).rows == [[101, 7592, 102]]


def test_usage_counts_the_tokens_sent_to_the_model(tokenizer: TextTokenizer) -> None:
    assert tokenize({"input": ["hello", "hello world"]}, tokenizer).prompt_tokens == 7


def test_unknown_fields_are_refused_by_name_as_openai_refuses_them(tokenizer: TextTokenizer) -> None:
    with pytest.raises(ApiError) as caught:
        tokenize({"input": "hi", "extra_body_field": 1}, tokenizer)
    assert (caught.value.status, caught.value.param) == (400, "extra_body_field")
    assert caught.value.message == "Unrecognized request argument supplied: extra_body_field"


def test_the_wire_form_concatenates_token_ids() -> None:
    params = PoolingParams(dimensions=8, normalize=False, activation=False)
    job = EngineJob(rows=[[1, 2], [3]], type_rows=[[0, 1], [0]], params=params)
    request = job.to_wire(priority=-2)
    assert (request.lengths, request.params, request.priority, request.images) == ([2, 1], params, -2, 0)
    assert [bytes(frame) for frame in ClientWire().encode(request)[1:]] == [
        np.asarray([1, 2, 3], dtype=TOKEN_DTYPE).tobytes(),
        np.asarray([0, 1, 0], dtype=TOKEN_DTYPE).tobytes(),
    ]


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({}, "input"),
        ({"input": "a", "messages": [{"role": "user", "content": "b"}]}, "input"),
        ({"input": []}, "input"),
        ({"input": ""}, "input[0]"),
        ({"input": ["a", ""]}, "input[1]"),
        ({"input": ["a", 1]}, "input[1]"),
        ({"input": [1, "a"]}, "input"),
        ({"input": [[1], 2]}, "input[1]"),
        ({"input": [[1], "a"]}, "input[1]"),
        ({"input": [[]]}, "input[0]"),
        ({"input": [True]}, "input[0]"),
        ({"input": {"text": "a"}}, "input"),
        ({"input": 5}, "input"),
        ({"input": [{"image": ""}]}, "input[0].image"),
        ({"input": [{"image": "x", "other": 1}]}, "input[0].other"),
        ({"input": "a", "encoding_format": "int8"}, "encoding_format"),
        ({"input": "a", "dimensions": 0}, "dimensions"),
        ({"input": "a", "dimensions": 385}, "dimensions"),
        ({"input": "a", "dimensions": "8"}, "dimensions"),
        ({"input": "a", "truncate_prompt_tokens": -2}, "truncate_prompt_tokens"),
        ({"input": "a", "truncate_prompt_tokens": 0}, "truncate_prompt_tokens"),
        ({"input": "a", "truncate_prompt_tokens": 257}, "truncate_prompt_tokens"),
        ({"input": "a", "truncate_prompt_tokens": 2}, "truncate_prompt_tokens"),
        ({"input": [[1, 30522]]}, "input[0]"),
        ({"input": [[-1]]}, "input[0]"),
        ({"input": [[2**70]]}, "input[0]"),
        ({"input": "word " * 300}, "input[0]"),
        ({"input": [[5] * 257]}, "input[0]"),
        ({"input": "a", "model": 3}, "model"),
        ({"messages": []}, "messages"),
        ({"messages": [{"role": "user", "content": [{"type": "video", "url": "x"}]}]}, "messages[0].content[0].type"),
    ],
)
def test_bad_input_is_a_400_naming_the_field(body: object, param: str, tokenizer: TextTokenizer) -> None:
    with pytest.raises(ApiError) as caught:
        tokenize(body, tokenizer)
    assert caught.value.status == 400
    assert caught.value.param == param, caught.value.message


@pytest.mark.parametrize("body", [b"", b"{", b"not json", b'{"input": "a",}', b"\xff\xfe"])
def test_malformed_json_is_a_400(body: bytes) -> None:
    with pytest.raises(ApiError) as caught:
        decode_body(body, _decoder)
    assert caught.value.status == 400
    assert "JSON" in caught.value.message


def test_too_many_inputs_is_a_400() -> None:
    with pytest.raises(ApiError) as caught:
        items_from_input(["a"] * 11, max_items=10)
    assert caught.value.param == "input"
    assert caught.value.code == "too_many_inputs"
    assert "limit of 10 per request (--max-inputs-per-request)" in caught.value.message


def test_texts_and_images_interleave_and_come_back_in_request_order(tokenizer: TextTokenizer) -> None:
    items = items_from_input(as_input(["a", {"image": "i1"}, "b", {"image": "i2"}]), max_items=10)
    assert items[1] == ImageSource("i1", "input[1].image")
    card = msgspec.structs.replace(CARD, kind="clip", image=ImageProcessing(crop_height=2, crop_width=2))
    loaded: list[str] = []

    def load(source: ImageSource) -> Any:
        loaded.append(source.source)
        return np.zeros((2, 2, 3), dtype=np.uint8)

    job = build_job(items, card, tokenizer, limit=None, load_image=load)
    assert loaded == ["i1", "i2"]
    assert len(job.rows) == 2 and len(job.images) == 2
    # The engine answers texts first, then images.
    assert job.order == [0, 2, 1, 3]


def test_images_are_refused_by_a_text_model(tokenizer: TextTokenizer) -> None:
    items = items_from_input(as_input([{"image": "i1"}]), max_items=10)
    with pytest.raises(ApiError) as caught:
        build_job(items, CARD, tokenizer, limit=None, load_image=None)
    assert caught.value.param == "input[0].image"
    assert "takes no images" in caught.value.message


def test_messages_with_an_image_and_text_are_refused() -> None:
    messages = msgspec.convert(
        [
            {
                "role": "user",
                "content": [{"type": "text", "text": "a"}, {"type": "image_url", "image_url": {"url": "u"}}],
            }
        ],
        type=list[ChatMessage],
    )
    with pytest.raises(ApiError):
        item_from_messages(messages)
    image_only = msgspec.convert(
        [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "u"}}]}], type=list[ChatMessage]
    )
    assert item_from_messages(image_only) == ImageSource("u", "messages[0].content[0].image_url.url")


def test_too_long_input_says_how_long_and_how_to_fix_it(tokenizer: TextTokenizer) -> None:
    with pytest.raises(ApiError) as caught:
        tokenize({"input": ["ok", "word " * 300]}, tokenizer)
    assert caught.value.code == "context_length_exceeded"
    assert "302 tokens" in caught.value.message
    assert "256" in caught.value.message
    assert "truncate_prompt_tokens" in caught.value.message


def test_truncation_on_request(tokenizer: TextTokenizer) -> None:
    long_text = "word " * 300
    assert [len(r) for r in tokenize({"input": long_text, "truncate_prompt_tokens": -1}, tokenizer).rows] == [256]
    cut = tokenize({"input": long_text, "truncate_prompt_tokens": 5}, tokenizer).rows
    assert cut == [[101, 2773, 2773, 2773, 102]]
    rows = tokenize({"input": [list(range(1000, 1300))], "truncate_prompt_tokens": 4}, tokenizer).rows
    assert rows == [[1000, 1001, 1002, 1003]]
    # Inputs already within the limit are left alone.
    assert tokenize({"input": "hello", "truncate_prompt_tokens": 10}, tokenizer).rows == [[101, 7592, 102]]


def test_model_name_and_task_checks() -> None:
    check_model(None, ["m"])
    check_model("m", ["m", "alias"])
    with pytest.raises(ApiError) as caught:
        check_model("other", ["m"])
    assert (caught.value.status, caught.value.code, caught.value.param) == (404, "model_not_found", "model")
    require_task(CARD, "embed", "/v1/embeddings")
    with pytest.raises(ApiError) as refused:
        require_task(CARD, "classify", "/classify")
    assert refused.value.status == 400
    assert "embed, score, pool, tokenize" in refused.value.message


def test_request_defaults() -> None:
    request = EmbeddingRequest(input="a")
    assert (request.encoding_format, request.dimensions, request.truncate_prompt_tokens) == ("float", None, None)


def test_a_prompt_left_out_of_pooling_starts_each_texts_pooling_after_it(tokenizer: TextTokenizer) -> None:
    """include_prompt false: each text after the prompt pools from the prompt's length on; token ids have no prompt;
    a cut that leaves nothing after the prompt, or rows without the special tokens it is counted with, are refused."""
    prompt = "query: "
    card = msgspec.structs.replace(CARD, prompt_lengths={prompt: 3})  # [CLS] query : ([SEP] left out)
    job = build_job(["hello", "hello world"], card, tokenizer, limit=None, prompt=prompt)
    assert job.rows[0] == [101, 23032, 1024, 7592, 102]
    assert job.params.pool_from == [3, 3] and job.to_wire().params.pool_from == [3, 3]
    assert build_job([[101, 7592, 102]], card, tokenizer, limit=None, prompt=prompt).params.pool_from == []
    assert build_job(["hello"], card, tokenizer, limit=None, prompt="").params.pool_from == []
    with pytest.raises(ApiError, match="leaves none of `input\\[0\\]` after the prompt"):
        build_job(["hello"], card, tokenizer, limit=3, prompt=prompt)
    with pytest.raises(ApiError, match="add_special_tokens"):
        build_job(["hello"], card, tokenizer, limit=None, prompt=prompt, add_special_tokens=False)
