"""Tokenization with the `tokenizers` library, from the tokenizer the engine sent in its handshake.

Long texts: only a model's first (or last) tokens can matter, so a long text is tokenized through a
window: a span at its start (or end) that grows until it holds enough tokens that are provably the
whole text's first (last) ones. Normalizers and pre-tokenizers read a text locally (WordPiece, BPE
and Unigram tokenizers split it into words at spaces and punctuation and tokenize each word on its
own), so cutting a text changes only the words next to the cut: the tokens of the EDGE_WORDS words
(and EDGE_CHARS characters) nearest the cut are not counted. tests/apiserver/requests/test_tokenizer.py
compares the windowed tokens with the whole text's on random texts for each tokenizer family.

The `tokenizers` calls that can take long run through `encode_batch`, which releases the GIL
(`encode` holds it: 3 s for a 3 MB text, during which the event loop could not answer /health).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Literal

from tokenizers import Encoding, Tokenizer

Direction = Literal["right", "left"]

# A window starts this many characters per token wide (English runs 4 to 5 per WordPiece token, so
# one window nearly always suffices) and grows this many times over while it holds too few tokens.
WINDOW_CHARS_PER_TOKEN = 8
WINDOW_SLACK_CHARS = 256
WINDOW_GROWTH = 4
# Next to a window's cut a word may be cut in two, or normalized by the character after the cut.
EDGE_WORDS = 2
EDGE_CHARS = 32


def window_width(need: int) -> int:
    """Characters in a first window for `need` tokens; a text no longer than this is tokenized whole."""
    return WINDOW_CHARS_PER_TOKEN * need + WINDOW_SLACK_CHARS


@dataclass(frozen=True, slots=True)
class Content:
    """A text's tokens without special tokens: all of them (`is_whole`), or a window whose first
    (`right` truncation) or last (`left`) `stable` tokens are the whole text's, at least as many as
    were asked for. The window's other tokens are kept (cutting them costs as much as a copy of the
    encoding, with the GIL held): truncation to no more than `stable` tokens drops them."""

    encoding: Encoding
    stable: int

    @property
    def is_whole(self) -> bool:
        return self.stable == len(self.encoding)

    def __len__(self) -> int:
        return self.stable


def stable_tokens(encoding: Encoding, width: int, direction: Direction) -> int:
    """How many tokens of a window `width` characters wide, counted from the text's own edge, are
    certainly the whole text's: those of words away from the cut. Looks only at the tokens next to
    the cut (a window may hold hundreds of thousands)."""
    count = len(encoding)
    at_cut: set[int | None] = set()  # the words next to the cut
    inward = range(count - 1, -1, -1) if direction == "right" else range(count)
    for unstable, i in enumerate(inward):
        word = encoding.token_to_word(i)
        if word not in at_cut:
            chars = encoding.token_to_chars(i)
            near_cut = chars is None or (
                chars[1] > width - EDGE_CHARS if direction == "right" else chars[0] < EDGE_CHARS
            )
            if len(at_cut) >= EDGE_WORDS and not near_cut and word is not None:
                return count - unstable
            at_cut.add(word)
    return 0


class TextTokenizer:
    """Thread-safe: each preprocessing thread gets its own Tokenizer, because truncation settings
    are state on the Tokenizer and a request may ask for its own limit and direction."""

    def __init__(self, tokenizer_json: str):
        self._json = tokenizer_json
        self._local = threading.local()
        tokenizer = self._tokenizer
        self.special_tokens = tokenizer.num_special_tokens_to_add(is_pair=False)
        self.pair_special_tokens = tokenizer.num_special_tokens_to_add(is_pair=True)
        self.vocab_size = tokenizer.get_vocab_size(with_added_tokens=True)

    @property
    def _tokenizer(self) -> Tokenizer:
        tokenizer: Tokenizer | None = getattr(self._local, "tokenizer", None)
        if tokenizer is None:
            tokenizer = Tokenizer.from_str(self._json)
            # A tokenizer.json may carry padding and truncation of its own (the bundled MiniLM pads
            # everything to 128): the engine pads, and truncation happens only when a request asks.
            tokenizer.no_padding()
            tokenizer.no_truncation()
            self._local.tokenizer = tokenizer
        return tokenizer

    def encode(self, texts: list[str], *, add_special_tokens: bool = True) -> list[list[int]]:
        """Token ids of each text, special tokens included."""
        tokenizer = self._tokenizer
        if len(texts) == 1:
            return [tokenizer.encode(texts[0], add_special_tokens=add_special_tokens).ids]
        return [e.ids for e in tokenizer.encode_batch(texts, add_special_tokens=add_special_tokens)]

    def token_id(self, token: str) -> int | None:
        """The id of a token as the vocabulary spells it (a special token's too); None for "" or one it lacks."""
        return self._tokenizer.token_to_id(token) if token else None

    def encode_truncated(
        self, text: str, max_tokens: int, direction: Direction = "right", *, add_special_tokens: bool = True
    ) -> list[int]:
        """At most `max_tokens` ids: the text is cut on one side, the special tokens (if added) are kept."""
        return self._encode_limited(text, None, max_tokens, direction, add_special_tokens=add_special_tokens).ids

    def encode_pairs(
        self, pairs: list[tuple[str, str]], max_tokens: int | None, direction: Direction = "right"
    ) -> tuple[list[list[int]], list[list[int]]]:
        """Ids and token type ids of each (first, second) pair; with a limit, the longer side is cut first."""
        tokenizer = self._tokenizer
        if max_tokens is None:
            encodings = tokenizer.encode_batch(pairs)
        else:
            encodings = [self._encode_limited(first, second, max_tokens, direction) for first, second in pairs]
        return [e.ids for e in encodings], [e.type_ids for e in encodings]

    def encode_detailed(self, text: str, *, add_special_tokens: bool) -> Encoding:
        """The full encoding: ids, token strings, character offsets and which tokens are special."""
        return self._tokenizer.encode(text, add_special_tokens=add_special_tokens)

    def encode_content(self, text: str, need: int, direction: Direction = "right") -> Content:
        """The text's tokens without special tokens: all of them, or at least its first (last) `need`,
        from a window when the text is longer than window_width(need) characters."""
        tokenizer = self._tokenizer
        width = window_width(need)
        while width < len(text):
            piece = text[:width] if direction == "right" else text[len(text) - width :]
            (encoding,) = tokenizer.encode_batch([piece], add_special_tokens=False)
            stable = stable_tokens(encoding, width, direction)
            if stable >= need:
                return Content(encoding, stable)
            width *= WINDOW_GROWTH
        (encoding,) = tokenizer.encode_batch([text], add_special_tokens=False)
        return Content(encoding, len(encoding))

    def finish(
        self,
        first: Content,
        second: Content | None = None,
        *,
        max_tokens: int | None = None,
        direction: Direction = "right",
        add_special_tokens: bool = True,
    ) -> Encoding:
        """The encoding `encode` would give the whole text (or pair): truncated to `max_tokens` as
        `encode_truncated` does, special tokens added. A window is finished only with a truncation that
        keeps no more than its stable tokens."""
        if max_tokens is None and not (first.is_whole and (second is None or second.is_whole)):
            raise ValueError("a window of a text is finished only with truncation")
        tokenizer = self._tokenizer
        if max_tokens is not None:
            tokenizer.enable_truncation(max_tokens, strategy="longest_first", direction=direction)
        try:
            return tokenizer.post_process(
                first.encoding, None if second is None else second.encoding, add_special_tokens=add_special_tokens
            )
        finally:
            if max_tokens is not None:
                tokenizer.no_truncation()

    def encode_windows(
        self, texts: list[str], max_tokens: int, overlap: int, *, add_special_tokens: bool = True
    ) -> list[list[list[int]]]:
        """Each text as windows of at most `max_tokens` ids, each with the special tokens the tokenizer adds, each
        window after the first repeating the last `overlap` text tokens of the one before: tokenizers' overflowing
        encodings with a stride, as transformers' `return_overflowing_tokens` gives them. A text that fits is one
        window, its ids as `encode` gives them. The whole text is tokenized (with the GIL released)."""
        tokenizer = self._tokenizer
        tokenizer.enable_truncation(max_tokens, stride=overlap, strategy="longest_first")
        try:
            encodings = tokenizer.encode_batch(texts, add_special_tokens=add_special_tokens)
        finally:
            tokenizer.no_truncation()
        return [[e.ids, *(piece.ids for piece in e.overflowing)] for e in encodings]

    def encode_pair_windows(
        self, pairs: list[tuple[str, str]], max_tokens: int, overlap: int
    ) -> list[list[tuple[list[int], list[int]]]]:
        """Ids and token type ids of each pair as windows of at most `max_tokens`: the first text whole in every
        window, the second cut into pieces overlapping by `overlap` tokens (tokenizers' `only_second` truncation
        with a stride). A pair that fits is one window."""
        tokenizer = self._tokenizer
        tokenizer.enable_truncation(max_tokens, stride=overlap, strategy="only_second")
        try:
            encodings = tokenizer.encode_batch(pairs)
        finally:
            tokenizer.no_truncation()
        return [[(piece.ids, piece.type_ids) for piece in (e, *e.overflowing)] for e in encodings]

    def count_tokens(self, text: str) -> int:
        """How many tokens the whole text has, special tokens left out (with the GIL released)."""
        (encoding,) = self._tokenizer.encode_batch([text], add_special_tokens=False)
        return len(encoding)

    def finish_pair_cut(
        self, first: Content, second: Content, lengths: tuple[int, int], direction: Direction
    ) -> Encoding:
        """A pair cut to `lengths` tokens a side (no more than each side's stable tokens), special tokens added."""
        for content, length in zip((first, second), lengths, strict=True):
            content.encoding.truncate(length, direction=direction)
        return self._tokenizer.post_process(first.encoding, second.encoding)

    def decode(self, ids: list[int], *, skip_special_tokens: bool = False) -> str:
        return self._tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)

    def token_strings(self, ids: list[int]) -> list[str]:
        tokenizer = self._tokenizer
        return [tokenizer.id_to_token(i) or "" for i in ids]

    def _encode_limited(
        self, first: str, second: str | None, max_tokens: int, direction: Direction, *, add_special_tokens: bool = True
    ) -> Encoding:
        tokenizer = self._tokenizer
        tokenizer.enable_truncation(max_tokens, strategy="longest_first", direction=direction)
        try:
            return tokenizer.encode(first, second, add_special_tokens=add_special_tokens)
        finally:
            tokenizer.no_truncation()


def longest_first(first: int, second: int, room: int) -> tuple[int, int]:
    """The tokens tokenizers' `longest_first` truncation keeps of a pair's sides, special tokens left
    out: both whole if they fit; else the longer cut to the room the shorter leaves; else half each,
    the odd token to the longer side (to the second when they are equal)."""
    if first + second <= room:
        return first, second
    shorter = min(first, second)
    kept_longer = shorter if shorter > room else max(shorter, room - shorter)
    kept_shorter = shorter
    if kept_shorter + kept_longer > room:
        kept_shorter = room // 2
        kept_longer = kept_shorter + room % 2
    return (kept_longer, kept_shorter) if first > second else (kept_shorter, kept_longer)
