"""Tokenization with the `tokenizers` library, from the tokenizer the engine sent in its handshake."""

from __future__ import annotations

from tokenizers import Tokenizer


class TextTokenizer:
    def __init__(self, tokenizer_json: str):
        tokenizer = Tokenizer.from_str(tokenizer_json)
        # A tokenizer.json may carry padding and truncation of its own (the bundled MiniLM pads
        # everything to 128): the engine pads, and truncation happens only when a request asks.
        tokenizer.no_padding()
        tokenizer.no_truncation()
        self._tokenizer = tokenizer
        self.special_tokens = tokenizer.num_special_tokens_to_add(is_pair=False)

    def encode(self, texts: list[str]) -> list[list[int]]:
        """Token ids of each text, special tokens included."""
        if len(texts) == 1:
            return [self._tokenizer.encode(texts[0]).ids]
        return [encoding.ids for encoding in self._tokenizer.encode_batch(texts)]

    def encode_truncated(self, text: str, max_tokens: int) -> list[int]:
        """At most `max_tokens` ids: the text is cut from the right, the special tokens are kept."""
        encoding = self._tokenizer.encode(text, add_special_tokens=False)
        encoding.truncate(max(max_tokens - self.special_tokens, 0))
        return self._tokenizer.post_process(encoding).ids
