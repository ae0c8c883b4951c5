from __future__ import annotations

import msgspec
import pytest

from apiserver.errors import ApiError
from apiserver.requests.schemas.embeddings import EmbeddingRequest
from apiserver.requests.validation import decode_body

DECODER = msgspec.json.Decoder(EmbeddingRequest)


@pytest.mark.parametrize(
    ("body", "says"),
    [
        # msgspec 0.23 says "Invalid UTF-8 encoded string" (a DecodeError); earlier releases raise
        # UnicodeDecodeError, which decode_body words itself
        (b'{"input": "\xff\xfe"}', "UTF-8"),
        (b'{"input": "\\ud800"}', "not valid JSON"),
        (b'{"input": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", "Expected `int`"),
        # An unknown field is refused by name before msgspec would skip it (by recursion): deep nesting there
        # cannot escape as a 500.
        (b'{"zzz": ' + b"[" * 5000 + b"]" * 5000 + b', "input": "hi"}', "argument supplied: zzz"),
        (b'{"zzz": ' + b'{"a":' * 5000 + b"1" + b"}" * 5000 + b', "input": "hi"}', "argument supplied: zzz"),
        # An unknown field inside a known one, where msgspec still skips: nesting there stays a 400 too.
        (
            b'{"messages": [{"role": "u", "content": "x", "zzz": ' + b"[" * 5000 + b"]" * 5000 + b"}]}",
            "nested too deeply",
        ),
        (b'{"input": [1e400]}', "Number out of range"),
        (b'{"input": "hi", "dimensions": 1e400}', "Number out of range"),
        (b"", "not valid JSON"),
    ],
)
def test_hostile_bodies_are_400s_naming_the_problem(body: bytes, says: str) -> None:
    with pytest.raises(ApiError) as caught:
        decode_body(body, DECODER)
    assert caught.value.status == 400
    assert says in caught.value.message


def test_unknown_fields_are_refused_with_their_path() -> None:
    with pytest.raises(ApiError) as caught:
        decode_body(b'{"input": [{"image": "data:,", "detail": "low"}]}', DECODER)
    assert caught.value.param == "input[0].detail"
