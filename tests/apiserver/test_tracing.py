"""Tracing off costs nothing: no OpenTelemetry loaded, no tracer, no middleware, and the engine asked for no
timings. (Tracing on, end to end: tests/e2e/test_tracing.py.)"""

from __future__ import annotations

import subprocess
import sys
from typing import Any

from apiserver.tracing import TraceRequests, start_tracing
from poolserve.config import Config

# A fresh interpreter: what an API server imports and builds with tracing off, then which OpenTelemetry modules
# are loaded.
NOTHING_LOADED = """
import sys
import apiserver.server, apiserver.app, apiserver.request_cycle
from apiserver.tracing import start_tracing
from poolserve.config import Config
assert start_tracing(Config(), 0) is None
print(sorted(name for name in sys.modules if name.startswith("opentelemetry")))
"""


def test_with_tracing_off_no_tracer_is_set_up_and_nothing_of_opentelemetry_is_loaded() -> None:
    assert start_tracing(Config(), 0) is None
    done = subprocess.run([sys.executable, "-c", NOTHING_LOADED], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"


def test_with_tracing_off_requests_pass_no_tracing_middleware_and_ask_the_engine_for_no_timings(serve: Any) -> None:
    served = serve()
    assert served.state.tracer is None
    assert TraceRequests not in [middleware.cls for middleware in served.client.app.user_middleware]
    traceparent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"  # a client's sampled trace
    answer = served.client.post("/v1/embeddings", json={"input": "hello"}, headers={"traceparent": traceparent})
    assert answer.status_code == 200, answer.text
    [sent] = served.engine.requests
    assert sent.traced is False
