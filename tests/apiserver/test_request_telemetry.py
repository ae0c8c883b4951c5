"""What the request telemetry middleware writes and refuses: the access log cannot be forged."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from apiserver.middleware import printable


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
