"""--request-timeout on the API server and engine of `launch` (stack_server.py): a request past it gets a 504 naming
the flag, and its work leaves the engine. The request cycle's clock and the abort it sends are one API server's and
one engine's code, which the test's process runs as `launch` does (once tests/e2e/test_faults.py, on a launch)."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from bench.harness.server_process import wait_until
from tests.in_process.stack_server import InProcessServer, served
from tests.utils import FLOAT32_CPU


@pytest.fixture(scope="module")
def timed() -> Iterator[InProcessServer]:
    with served("--request-timeout", "1", *FLOAT32_CPU) as server:
        yield server


def test_a_request_over_its_timeout_gets_504_and_its_work_is_dropped(timed: InProcessServer) -> None:
    # 1500 inputs of ~70 tokens: many seconds of the engine's work on a CPU, so the timeout falls while most is queued.
    big = {"input": [f"a long sentence about embeddings number {i} " * 8 for i in range(1500)]}
    with timed.client() as client:
        started = time.monotonic()
        response = client.post("/v1/embeddings", json=big)
        assert response.status_code == 504, response.text
        assert "--request-timeout" in response.json()["error"]["message"]
        assert time.monotonic() - started < 4
        assert wait_until(lambda: client.get("/health").json()["engine"]["queued_inputs"] == 0, 5)
