from __future__ import annotations

from pathlib import Path

import pytest
from transformers import AutoTokenizer

from apiserver.tokenizer import TextTokenizer
from tests.sentences import SENTENCES


@pytest.fixture(scope="module")
def hf_tokenizer(bundled_model: Path):  # type: ignore[no-untyped-def]
    return AutoTokenizer.from_pretrained(bundled_model)


@pytest.fixture(scope="module")
def tokenizer(bundled_model: Path) -> TextTokenizer:
    # The file as shipped: it pads to 128 and truncates at 128, which TextTokenizer must switch off.
    return TextTokenizer((bundled_model / "tokenizer.json").read_text())


def test_ids_equal_transformers_without_padding(tokenizer: TextTokenizer, hf_tokenizer) -> None:  # type: ignore[no-untyped-def]
    assert tokenizer.encode(SENTENCES) == hf_tokenizer(SENTENCES)["input_ids"]
    assert tokenizer.encode(SENTENCES[:1]) == hf_tokenizer(SENTENCES[:1])["input_ids"]


def test_long_text_is_not_truncated_unless_asked(tokenizer: TextTokenizer) -> None:
    text = "word " * 400
    assert len(tokenizer.encode([text])[0]) == 402


@pytest.mark.parametrize("limit", [3, 10, 256])
def test_truncation_keeps_special_tokens_like_transformers(tokenizer: TextTokenizer, hf_tokenizer, limit: int) -> None:  # type: ignore[no-untyped-def]
    text = " ".join(SENTENCES * 2)
    expected = hf_tokenizer(text, truncation=True, max_length=limit)["input_ids"]
    assert tokenizer.encode_truncated(text, limit) == expected
    assert len(expected) == limit
