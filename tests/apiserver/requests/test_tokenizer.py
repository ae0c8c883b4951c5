from __future__ import annotations

import itertools
import random
import time
from pathlib import Path
from typing import Any

import msgspec
import pytest
from tokenizers import Regex, Tokenizer, models, normalizers, pre_tokenizers, processors, trainers
from transformers import AutoTokenizer

from apiserver.errors import ApiError
from apiserver.requests.inputs.text import tokenize_pairs, tokenize_texts
from apiserver.requests.limits import TokenBudget
from apiserver.requests.tokenizer import Direction, TextTokenizer, longest_first
from tests.cards import CARD
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


# Long texts through windows -------------------------------------------------------------------

WORDS = [
    "the", "embedding", "server's", "naïve", "cafe\u0301", "ÅNGSTRÖM", "straße", "東京都", "한국어", "🙂👍🏽",
    "don't", "U.S.A.", "3.14159", "1,000,000", "foo_bar", "x" * 150, "a-b-c", "(quoted)", "...", "—",
    "e\u0301\u0301", "\u200b", "\u00a0", "mañana", "İstanbul", "ﬁne", "Ⅻ", "\ufeff",
]  # fmt: skip
SEPARATORS = [" ", " ", " ", "  ", "\n", "\t", " \n\n ", "", "      "]


def random_text(rng: random.Random, words: int) -> str:
    return "".join(rng.choice(WORDS) + rng.choice(SEPARATORS) for _ in range(words)).strip(" ")


def train(model: Any, trainer: Any, pre_tokenizer: Any, normalizer: Any = None, decoder: Any = None) -> Tokenizer:
    tokenizer = Tokenizer(model)
    tokenizer.normalizer = normalizer
    tokenizer.pre_tokenizer = pre_tokenizer
    rng = random.Random(0)
    tokenizer.train_from_iterator([random_text(rng, 30) for _ in range(300)], trainer)
    return tokenizer


def byte_level_bpe() -> Tokenizer:
    """RoBERTa's shape: byte-level BPE, `<s> A </s></s> B </s>`."""
    tokenizer = train(
        models.BPE(), trainers.BpeTrainer(vocab_size=400, special_tokens=["<s>", "</s>"]),
        pre_tokenizers.ByteLevel(add_prefix_space=False),
    )  # fmt: skip
    tokenizer.post_processor = processors.RobertaProcessing(("</s>", 1), ("<s>", 0))
    return tokenizer


def metaspace_unigram() -> Tokenizer:
    """XLM-R's and T5's shape: NFKC, Metaspace, a Unigram model, `A </s>`."""
    tokenizer = train(
        models.Unigram(), trainers.UnigramTrainer(vocab_size=300, special_tokens=["</s>", "<unk>"], unk_token="<unk>"),
        pre_tokenizers.Metaspace(), normalizers.NFKC(),
    )  # fmt: skip
    tokenizer.post_processor = processors.TemplateProcessing(
        single="$A </s>", pair="$A </s> $B </s>", special_tokens=[("</s>", 0)]
    )
    return tokenizer


def clip_bpe() -> Tokenizer:
    """CLIP's shape: NFC, whitespace collapsed, lower case, a regex split and byte-level BPE."""
    tokenizer = train(
        models.BPE(), trainers.BpeTrainer(vocab_size=400, special_tokens=["<|startoftext|>", "<|endoftext|>"]),
        pre_tokenizers.Sequence([
            pre_tokenizers.Split(
                Regex(r"""'s|'t|'re|'ve|'m|'ll|'d|[\p{L}]+|[\p{N}]|[^\s\p{L}\p{N}]+"""), "removed", invert=True
            ),
            pre_tokenizers.ByteLevel(add_prefix_space=False),
        ]),
        normalizers.Sequence([normalizers.NFC(), normalizers.Replace(Regex(r"\s+"), " "), normalizers.Lowercase()]),
    )  # fmt: skip
    tokenizer.post_processor = processors.TemplateProcessing(
        single="<|startoftext|> $A <|endoftext|>", special_tokens=[("<|startoftext|>", 0), ("<|endoftext|>", 1)]
    )
    return tokenizer


@pytest.fixture(scope="module", params=["bundled", "byte_level_bpe", "metaspace_unigram", "clip_bpe"])
def any_tokenizer(request: pytest.FixtureRequest, bundled_model: Path) -> TextTokenizer:
    if request.param == "bundled":
        return TextTokenizer((bundled_model / "tokenizer.json").read_text())
    return TextTokenizer(globals()[request.param]().to_str())


def whole(tokenizer: TextTokenizer, text: str) -> list[int]:
    return tokenizer._tokenizer.encode(text, add_special_tokens=False).ids


@pytest.mark.parametrize("direction", ["right", "left"])
def test_a_window_holds_the_whole_texts_first_or_last_tokens(
    any_tokenizer: TextTokenizer, direction: Direction
) -> None:
    rng = random.Random(direction)
    windowed = 0
    for _ in range(30):
        text = random_text(rng, rng.choice([50, 300, 900]))
        need = rng.choice([1, 7, 60, 254])
        content = any_tokenizer.encode_content(text, need, direction)
        expected = whole(any_tokenizer, text)
        if content.is_whole:
            assert content.encoding.ids == expected
            continue
        windowed += 1
        window = content.encoding.ids
        ids = window[: content.stable] if direction == "right" else window[len(window) - content.stable :]
        assert len(ids) >= need
        assert ids == (expected[: len(ids)] if direction == "right" else expected[len(expected) - len(ids) :])
        limit = need + any_tokenizer.special_tokens
        finished = any_tokenizer.finish(content, max_tokens=limit, direction=direction).ids
        assert finished == any_tokenizer.encode_truncated(text, limit, direction)
    assert windowed > 10  # the texts were long enough to need windows


def test_a_text_with_no_words_to_count_is_tokenized_whole(tokenizer: TextTokenizer) -> None:
    text = " " * 100_000 + "end"  # the window grows to the whole text: nothing before "end" is a token
    content = tokenizer.encode_content(text, 10)
    assert content.is_whole and content.encoding.ids == whole(tokenizer, text)


def test_a_long_text_costs_a_window_not_the_whole_text(tokenizer: TextTokenizer) -> None:
    text = "word " * 2_000_000  # 10 MB: tokenizing it whole takes seconds
    started = time.perf_counter()
    content = tokenizer.encode_content(text, 254)
    assert time.perf_counter() - started < 0.5
    assert not content.is_whole and len(content) >= 254


def test_long_texts_get_the_rows_of_tokenizing_them_whole(tokenizer: TextTokenizer) -> None:
    card = msgspec.structs.replace(CARD, max_model_len=64)
    rng = random.Random(3)
    texts = [random_text(rng, n) for n in (5, 40, 900, 3000)]
    for direction in ("right", "left"):
        rows = tokenize_texts(texts, ["t"] * 4, 20, tokenizer, card, direction=direction)
        assert rows == [tokenizer.encode_truncated(text, 20, direction) for text in texts]
    with pytest.raises(ApiError, match="`t2` has more than 300 tokens"):  # 900 words, 6000 characters
        tokenize_texts(
            texts, ["t0", "t1", "t2", "t3"], None, tokenizer, msgspec.structs.replace(card, max_model_len=300)
        )


def test_long_texts_without_special_tokens_get_the_rows_of_tokenizing_them_whole(tokenizer: TextTokenizer) -> None:
    card = msgspec.structs.replace(CARD, max_model_len=64)
    rng = random.Random(4)
    texts = [random_text(rng, n) for n in (5, 40, 900, 3000)]
    bare = [tokenizer._tokenizer.encode(text, add_special_tokens=False).ids for text in texts]
    rows = tokenize_texts(texts, ["t"] * 4, 20, tokenizer, card, add_special_tokens=False)
    assert rows == [ids[:20] for ids in bare]
    rows = tokenize_texts(texts, ["t"] * 4, 20, tokenizer, card, direction="left", add_special_tokens=False)
    assert rows == [ids[-20:] for ids in bare]
    # The model's maximum holds the text's own tokens: 64 of them, not 62.
    assert tokenize_texts(["word " * 64], ["t"], None, tokenizer, card, add_special_tokens=False) == [[2773] * 64]
    with pytest.raises(ApiError, match="`t` has 66 tokens"):
        tokenize_texts(["word " * 64], ["t"], None, tokenizer, card)


@pytest.mark.parametrize("room", [21, 22])  # longest_first gives an odd room's extra token to the longer side
def test_long_pairs_get_the_rows_of_tokenizing_them_whole(any_tokenizer: TextTokenizer, room: int) -> None:
    card = msgspec.structs.replace(CARD, max_model_len=4096)
    limit = room + any_tokenizer.pair_special_tokens
    rng = random.Random(room)
    sizes = [1, 3, 8, 15, 30, 60, 120, 250]  # a window is 440 characters, about 60 words
    pairs = [(random_text(rng, a), random_text(rng, b)) for a in sizes for b in sizes]
    whole = any_tokenizer._tokenizer
    for direction in ("right", "left"):
        rows, types = tokenize_pairs(pairs, ["p"] * len(pairs), limit, any_tokenizer, card, direction=direction)
        whole.enable_truncation(limit, strategy="longest_first", direction=direction)
        expected = whole.encode_batch(pairs)
        whole.no_truncation()
        assert rows == [e.ids for e in expected]
        assert types == [e.type_ids for e in expected]


def test_longest_first_keeps_what_tokenizers_keeps(tokenizer: TextTokenizer) -> None:
    whole = tokenizer._tokenizer
    for room in range(12):
        whole.enable_truncation(room + tokenizer.pair_special_tokens, strategy="longest_first")
        for first, second in itertools.product(range(14), repeat=2):
            encoding = whole.encode("x " * first, "y " * second)
            kept = encoding.type_ids.count(0) - 2, encoding.type_ids.count(1) - 1  # [CLS] A [SEP] B [SEP]
            assert longest_first(first, second, room) == kept, (first, second, room)
    whole.no_truncation()


def test_a_request_past_its_token_budget_stops_at_the_chunk_that_passes_it(tokenizer: TextTokenizer) -> None:
    texts = ["one two three four five six"] * 1000  # 8 tokens each
    with pytest.raises(ApiError, match=r"has at least 1024 tokens, more than this server's limit of 1000"):
        tokenize_texts(texts, ["t"] * 1000, None, tokenizer, CARD, budget=TokenBudget(1000))
    assert len(tokenize_texts(texts, ["t"] * 1000, None, tokenizer, CARD, budget=TokenBudget(8000))) == 1000
