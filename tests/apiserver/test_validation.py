from __future__ import annotations

import msgspec
import pytest

from apiserver.errors import ApiError
from apiserver.schemas.embeddings import EmbeddingRequest
from apiserver.validation import decode_body

DECODER = msgspec.json.Decoder(EmbeddingRequest)


@pytest.mark.parametrize(
    ("body", "says"),
    [
        (b'{"input": "\xff\xfe"}', "not valid UTF-8"),
        (b'{"input": "\\ud800"}', "not valid JSON"),
        (b'{"input": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", "Expected `int`"),
        # An unknown field is skipped by recursion: nesting there must not escape as a 500.
        (b'{"zzz": ' + b"[" * 5000 + b"]" * 5000 + b', "input": "hi"}', "nested too deeply"),
        (b'{"zzz": ' + b'{"a":' * 5000 + b"1" + b"}" * 5000 + b', "input": "hi"}', "nested too deeply"),
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


def test_shallow_unknown_fields_are_ignored() -> None:
    assert decode_body(b'{"zzz": [[{"a": 1}]], "input": "hi"}', DECODER).input == "hi"
