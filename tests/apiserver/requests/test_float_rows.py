"""Vectors in JSON: each float32 value in the shortest decimal form that reads back as the same float32."""

from __future__ import annotations

import json
import re
from typing import Any

import numpy as np
import pytest

from engine_client import PooledResult
from poolserve.protocol import EngineRequest
from tests.apiserver.served_app import DIM

ROWS = np.random.default_rng(7).standard_normal((3, DIM)).astype(np.float32) * np.float32(0.01)
ROWS[0, 0] = np.float32(1e-7)  # written with an exponent
ROWS[0, 1] = -0.0


def answer(request: EngineRequest) -> PooledResult:
    return PooledResult(ROWS[: len(request.lengths)].copy())


def significant_digits(number: str) -> int:
    mantissa = re.split("[eE]", number.lstrip("-"))[0].replace(".", "").lstrip("0")
    return len(mantissa) or 1


@pytest.mark.parametrize(
    ("path", "body", "vectors"),
    [
        (
            "/v1/embeddings",
            {"input": ["a", "b", "c"]},
            lambda answer: [d["embedding"] for d in answer["data"]],
        ),
        ("/embed", {"inputs": ["a", "b", "c"], "normalize": False}, lambda answer: answer),
        ("/pooling", {"input": ["a", "b", "c"]}, lambda answer: [d["data"] for d in answer["data"]]),
    ],
)
def test_vectors_are_the_float32_values_in_their_shortest_form(
    serve: Any, path: str, body: dict[str, Any], vectors: Any
) -> None:
    served = serve(engine_answer=answer)
    response = served.client.post(path, json=body)
    assert response.status_code == 200, response.text
    got = np.asarray(vectors(json.loads(response.text)), dtype=np.float32)
    assert np.array_equal(got, ROWS)  # exact once read back as float32
    assert np.signbit(got[0, 1])
    written = vectors(json.loads(response.text, parse_float=str))  # each number as the server wrote it
    # A float32 needs at most 9 significant digits; a float64's shortest form of the same value takes up to 17.
    assert max(significant_digits(number) for row in written for number in row) <= 9, response.text
