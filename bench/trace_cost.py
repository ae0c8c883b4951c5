"""What one traced request's spans cost, measured apart from a server: the five spans poolserve makes for a
request (its own, parse, engine.queue, one engine.forward, render), created and ended as the event loop does
(this thread's CPU time), and the export thread's OTLP protobuf encoding per span. The loop outruns the export
thread here, so the SDK says it drops spans past its queue's bound: that is its rule, and the loop's cost is the
same.

    python -m bench.trace_cost [--requests 3000]
"""

from __future__ import annotations

import argparse
import time

from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.util.types import AttributeValue

from apiserver.connection.request_tracer import RequestTracer
from bench.otlp_sink import OtlpReceiver
from poolserve.config import Config
from poolserve.protocol import ForwardPass

SCOPE = {
    "headers": [(b"traceparent", b"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")],
    "method": "POST",
    "path": "/v1/embeddings",
}
ATTRIBUTES: dict[str, AttributeValue] = {
    "http.route": "/v1/embeddings",
    "poolserve.model": "m",
    "poolserve.inputs": 1,
    "poolserve.tokens": 9,
}


def loop_us_per_request(tracer: RequestTracer, requests: int) -> float:
    now = time.time_ns()
    passes = [ForwardPass(now - 2_000_000, now - 1_000_000, 16, 160, 256, 1)]
    started = time.thread_time()
    for _ in range(requests):
        span = tracer.start_request(SCOPE)
        assert span is not None
        tracer.add_step(span, "parse", 1e-4)
        span.set_attributes(ATTRIBUTES)
        tracer.add_engine(span, 1e-3, passes)
        tracer.add_step(span, "render", 1e-4)
        tracer.end_request(span, 200, "id", None)
    return (time.thread_time() - started) / requests * 1e6


def encode_us_per_span(count: int) -> float:
    finished = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(finished))
    tracer = provider.get_tracer("bench")
    for _ in range(count):
        tracer.start_span("engine.forward", attributes={"poolserve.batch.inputs": 16}).end()
    spans: list[ReadableSpan] = list(finished.get_finished_spans())
    started = time.thread_time()
    for _ in range(5):
        encode_spans(spans).SerializePartialToString()
    return (time.thread_time() - started) / (5 * count) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=3000)
    args = parser.parse_args()
    receiver = OtlpReceiver(decodes=False).start()
    tracer = RequestTracer(Config(otlp_endpoint=receiver.url), 0)
    try:
        loop = loop_us_per_request(tracer, args.requests)
    finally:
        tracer.shutdown()
        receiver.stop()
    print(
        f"event loop: {loop:.0f} µs a traced request; export thread: {encode_us_per_span(1000):.1f} µs a span encoded"
    )


if __name__ == "__main__":
    main()
