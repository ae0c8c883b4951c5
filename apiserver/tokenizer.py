"""Tokenization with the `tokenizers` library, from the tokenizer the engine sent in its handshake."""

from __future__ import annotations

import threading
from typing import Literal

from tokenizers import Encoding, Tokenizer

Direction = Literal["right", "left"]


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

    def encode_truncated(self, text: str, max_tokens: int, direction: Direction = "right") -> list[int]:
        """At most `max_tokens` ids: the text is cut on one side, the special tokens are kept."""
        return self._encode_limited(text, None, max_tokens, direction).ids

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

    def decode(self, ids: list[int], *, skip_special_tokens: bool = False) -> str:
        return self._tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)

    def token_strings(self, ids: list[int]) -> list[str]:
        tokenizer = self._tokenizer
        return [tokenizer.id_to_token(i) or "" for i in ids]

    def _encode_limited(self, first: str, second: str | None, max_tokens: int, direction: Direction) -> Encoding:
        tokenizer = self._tokenizer
        tokenizer.enable_truncation(max_tokens, strategy="longest_first", direction=direction)
        try:
            return tokenizer.encode(first, second)
        finally:
            tokenizer.no_truncation()
