"""What the request telemetry middleware writes and refuses: the access log cannot be forged."""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import pytest

from apiserver.connection.telemetry import printable
from engine_client import PooledResult
from poolserve.protocol import EngineRequest


@pytest.mark.parametrize("path", ["/nothing%0A2026-11-25 INFO request_id=admin", "/v1/embeddings%0A", "/health%7F"])
def test_a_path_with_a_control_character_is_refused_and_cannot_forge_a_log_line(
    serve: Any, path: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Percent-decoded, the path would write a record of its own into the access log, and `/v1/embeddings\\n`
    would match its route (a regex `$` matches before a final newline)."""
    served = serve(config={"access_log": True})
    with caplog.at_level(logging.INFO, logger="poolserve.access"):
        response = served.client.post(path, json={"input": "hi"})
    assert response.status_code == 400, response.text
    assert response.json()["error"]["code"] == "invalid_path"
    assert not served.engine.requests
    [record] = [r for r in caplog.records if r.name == "poolserve.access"]
    line = record.getMessage()
    assert "\n" not in line and "\x7f" not in line and "path=/" in line
    assert printable("a\nb\x7fé") == "a\\nb\\x7fé"


def test_cache_hits_are_told_only_where_the_operator_asks(serve: Any) -> None:
    """x-cache-hits tells a client whether anyone embedded a text before: a membership oracle across users,
    so it is sent only with --cache-hits-header."""

    def cached_answer(request: EngineRequest) -> PooledResult:
        return PooledResult(np.zeros((len(request.lengths), 4), dtype=np.float32), cached=len(request.lengths))

    quiet = serve(engine_answer=cached_answer, card={"output_size": 4})
    assert "x-cache-hits" not in quiet.client.post("/v1/embeddings", json={"input": ["a", "b"]}).headers
    told = serve(engine_answer=cached_answer, card={"output_size": 4}, config={"cache_hits_header": True})
    assert told.client.post("/v1/embeddings", json={"input": ["a", "b"]}).headers["x-cache-hits"] == "2"
