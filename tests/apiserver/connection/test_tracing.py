"""Tracing off costs nothing: no OpenTelemetry loaded, no tracer, no middleware, and the engine asked for no
timings. On, in process: a sampled request asks the engine for its passes and draws them. (End to end, on a real
`launch`: tests/e2e/test_tracing.py.)"""

from __future__ import annotations

import subprocess
import sys
from typing import Any

from apiserver.connection.tracing import start_tracing
from bench.otlp_sink import OtlpReceiver
from engine_client import PooledResult
from poolserve.config import Config
from poolserve.protocol import EngineRequest, ForwardPass
from tests.apiserver.served_app import DIM, answering

TRACE = "0af7651916cd43dd8448eb211c80319c"

# A fresh interpreter: what an API server imports and builds with tracing off, then which OpenTelemetry modules
# are loaded.
NOTHING_LOADED = """
import sys
import apiserver.process, apiserver.app, apiserver.requests.request_cycle
from apiserver.connection.tracing import start_tracing
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
    assert served.client.app.wrapped is None  # the gate calls its checks directly: no layer between
    traceparent = f"00-{TRACE}-b7ad6b7169203331-01"  # a client's sampled trace
    answer = served.client.post("/v1/embeddings", json={"input": "hello"}, headers={"traceparent": traceparent})
    assert answer.status_code == 200, answer.text
    [sent] = served.engine.requests
    assert sent.traced is False


def test_a_sampled_request_asks_the_engine_for_its_passes_and_draws_them_under_its_span(serve: Any) -> None:
    receiver = OtlpReceiver().start()
    tracer = start_tracing(Config(otlp_endpoint=receiver.url, trace_sampler="parentbased_always_off"), 0)
    assert tracer is not None
    passes = [
        ForwardPass(1_000_000_000, 1_002_000_000, 8, 40, 64, 1),
        ForwardPass(1_003_000_000, 1_004_000_000, 2, 9, 10, 1),
    ]

    def answer(request: EngineRequest) -> PooledResult:
        rows = answering(DIM)(request).vectors
        return PooledResult(rows, queue_time=0.25, passes=passes if request.traced else None)

    served = serve(engine_answer=answer, tracer=tracer)
    try:
        # The client's sampled trace, its unsampled one (parent-based: followed), and a header that is no trace
        # context (read as none: the root sampler, off here, decides).
        for traceparent in (f"00-{TRACE}-b7ad6b7169203331-01", f"00-{TRACE}-b7ad6b7169203331-00", "00-garbage"):
            headers = {"traceparent": traceparent}
            response = served.client.post("/v1/embeddings", json={"input": ["hello", "world"]}, headers=headers)
            assert response.status_code == 200, response.text
    finally:
        tracer.shutdown()  # sends what is queued
        receiver.stop()
    assert [request.traced for request in served.engine.requests] == [True, False, False]
    spans = {span.name: span for span in receiver.spans()}
    assert sorted(spans) == ["POST /v1/embeddings", "engine.forward", "engine.queue", "parse", "render"]
    forwards = [span for span in receiver.spans() if span.name == "engine.forward"]
    assert [(span.start_ns, span.end_ns) for span in forwards] == [(p.start_ns, p.end_ns) for p in passes]
    assert forwards[0].attributes == {
        "poolserve.batch.inputs": 8,
        "poolserve.batch.tokens": 40,
        "poolserve.batch.padded_tokens": 64,
        "poolserve.batch.request_inputs": 1,
    }
    assert (spans["engine.queue"].start_ns, spans["engine.queue"].end_ns) == (750_000_000, 1_000_000_000)
    root = spans["POST /v1/embeddings"]
    assert root.attributes["poolserve.inputs"] == 2 and root.attributes["poolserve.cached_inputs"] == 0
    assert {span.parent_span_id for span in receiver.spans() if span is not root} == {root.span_id}
