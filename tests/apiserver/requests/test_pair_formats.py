"""--score-format's rows built in the API server from each part's token ids, cut as mxbai-rerank and FlagEmbedding
cut them, and the requests such a model cannot honour refused by name (the rows against the packages themselves:
tests/fidelity/test_served.py)."""

from __future__ import annotations

from typing import Any

import pytest

from apiserver.errors import ApiError
from apiserver.requests.inputs.text import Truncation
from apiserver.requests.pair_formats import GEMMA, MXBAI, Parts, join_parts, package_max_length, tokenize_format_pairs
from apiserver.requests.tokenizer import TextTokenizer
from poolserve.model_card import ModelCard
from tests.utils import reranker_card

PARTS = Parts(head=(900, 901), sep=(10,), tail=(10, 950, 951, 952))


def test_mxbai_cuts_the_query_to_three_quarters_and_the_document_to_what_is_left() -> None:
    max_length = package_max_length(MXBAI, 30, PARTS)
    assert max_length == 30 - 2 - 4
    query, document = list(range(100, 140)), list(range(200, 240))
    row = join_parts(MXBAI, query, document, max_length, PARTS)
    assert len(row) == 30
    assert row[:2] == [900, 901] and row[-4:] == [10, 950, 951, 952]
    assert row[2:20] == query[:18]  # 24 * 3 // 4
    assert row[20:26] == [10, *document[:5]]
    # Short parts are left whole.
    assert join_parts(MXBAI, [1], [2], max_length, PARTS) == [900, 901, 1, 10, 2, 10, 950, 951, 952]


def test_mxbai_caps_its_max_length_at_its_default_of_8192() -> None:
    assert package_max_length(MXBAI, 100_000, PARTS) == 8192


def test_gemma_cuts_the_passage_to_max_length_then_the_pair_to_max_length_and_the_prompt() -> None:
    parts = Parts(head=(2,), sep=(10,), tail=(10, 950, 951))
    max_length = package_max_length(GEMMA, 30, parts)
    assert max_length == 30 - 2 * 3
    query, document = list(range(100, 140)), list(range(200, 240))
    row = join_parts(GEMMA, query, document, max_length, parts)
    assert len(row) == 30
    assert row[:19] == [2, *query[:18]]  # BOS, then 24 * 3 // 4 of the query
    assert row[19:27] == [10, *document[:7]]  # the pair cut to 24 + 3
    assert row[-3:] == [10, 950, 951]
    assert join_parts(GEMMA, [1], [2], max_length, parts) == [2, 1, 10, 2, 10, 950, 951]


def card_for(hf_tokenizer: Any, name: str, max_model_len: int = 256) -> ModelCard:
    return reranker_card(hf_tokenizer, max_model_len, "Qwen2ForCausalLM", pair_format=name)


def tokenize(hf_tokenizer: Any, name: str, pairs: list[tuple[str, str]], **kwargs: Any) -> list[list[int]]:
    card = card_for(hf_tokenizer, name, kwargs.pop("max_model_len", 256))
    truncation = kwargs.pop("truncation", Truncation(None))
    tokenizer = TextTokenizer(card.tokenizer_json)
    return tokenize_format_pairs(pairs, ["documents"] * len(pairs), truncation, tokenizer, card, **kwargs)


def test_an_instruction_goes_before_mxbai_s_query_and_gemma_refuses_one(hf_tokenizer: Any) -> None:
    plain, instructed = (
        tokenize(hf_tokenizer, MXBAI, [("q", "d")], instruction=instruction)[0] for instruction in (None, "be brief")
    )
    assert hf_tokenizer.decode(instructed) == hf_tokenizer.decode(plain).replace(
        "query: q", "instruction: be brief\nquery: q"
    )
    with pytest.raises(ApiError, match="no place for an `instruction`") as refused:
        tokenize(hf_tokenizer, GEMMA, [("q", "d")], instruction="be brief")
    assert refused.value.param == "instruction"


def test_a_pair_the_package_would_cut_is_refused_unless_truncation_is_asked(hf_tokenizer: Any) -> None:
    long = " ".join(["servers"] * 300)
    with pytest.raises(ApiError, match="as mxbai-rerank-v2 reads it") as refused:
        tokenize(hf_tokenizer, MXBAI, [("q", long)])
    assert refused.value.code == "context_length_exceeded"
    for name in (MXBAI, GEMMA):
        (row,) = tokenize(hf_tokenizer, name, [(long, long)], truncation=Truncation(256))
        assert len(row) <= 256
    with pytest.raises(ApiError, match="from the right only"):
        tokenize(hf_tokenizer, MXBAI, [("q", long)], truncation=Truncation(256, direction="left"))
    with pytest.raises(ApiError, match="must leave room for text"):
        tokenize(hf_tokenizer, MXBAI, [("q", "d")], truncation=Truncation(20))


def test_gemma_puts_no_bos_where_the_tokenizer_has_none(hf_tokenizer: Any) -> None:
    (row,) = tokenize(hf_tokenizer, GEMMA, [("q", "d")])
    assert hf_tokenizer.decode(row).startswith("A: q\nB: d\nGiven a query A")
