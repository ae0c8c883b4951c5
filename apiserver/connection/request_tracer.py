"""OpenTelemetry's side of tracing: the SDK's provider, sampler and OTLP/HTTP exporter, and the spans a request is
drawn with. Imported only when tracing is on (connection/tracing.py), so a server without it loads none of the SDK.

The engine's part of a request (its wait in the queue, each forward pass it rode in) is drawn here too, from the
times the engine reports in its reply (`ForwardPass`), rather than by an SDK in the engine: the engine is the one
process every API server shares, and its scheduler thread's time per request is what decides whether batches
fill, so it only reads the clock twice and keeps six numbers per pass; spans, their export thread and protobuf encoding
stay in the API servers, which scale out. Both ends read the same host's wall clock (the engine's socket is a
local ipc path), and a request resubmitted after an engine died is drawn with the passes of the engine that
answered it, from the same process that holds its span.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping

from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider, sampling
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.trace import Span, SpanKind, Status, StatusCode, set_span_in_context
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from opentelemetry.util.types import AttributeValue
from starlette.types import Scope

from poolserve.config import Config
from poolserve.protocol import ForwardPass

TRACES_PATH = "/v1/traces"
# The headers W3C Trace Context reads: the parent span and the vendors' state.
TRACE_HEADERS = frozenset((b"traceparent", b"tracestate"))


def traces_url(endpoint: str) -> str:
    """The URL spans are posted to: a collector's base URL gets OTLP's traces path, as OTEL_EXPORTER_OTLP_ENDPOINT
    does; a URL that already ends in it is used as it is."""
    if endpoint.rstrip("/").endswith(TRACES_PATH):
        return endpoint
    return endpoint.rstrip("/") + TRACES_PATH


def sampler_of(config: Config) -> sampling.Sampler:
    ratio = sampling.TraceIdRatioBased(config.trace_sampler_arg)
    root: sampling.Sampler = {
        "always_on": sampling.ALWAYS_ON,
        "always_off": sampling.ALWAYS_OFF,
        "traceidratio": ratio,
    }[config.trace_sampler.removeprefix("parentbased_")]
    return sampling.ParentBased(root) if config.trace_sampler.startswith("parentbased_") else root


class RequestTracer:
    """This process's tracer provider, its batch export thread, and the spans a request is drawn with."""

    def __init__(self, config: Config, server_index: int):
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        resource = Resource.create({"service.name": config.otlp_service_name, "poolserve.api_server": server_index})
        self.provider = TracerProvider(sampler=sampler_of(config), resource=resource)
        # The batch processor's thread encodes and posts; a span ending on the event loop only joins its queue
        # (spans past its bound, 2048 by default, are dropped, never waited for).
        self.provider.add_span_processor(
            BatchSpanProcessor(OTLPSpanExporter(endpoint=traces_url(config.otlp_endpoint)))
        )
        self.tracer = self.provider.get_tracer("poolserve")
        self.propagator = TraceContextTextMapPropagator()
        self.server = str(server_index)

    def start_request(self, scope: Scope) -> Span | None:
        """The span of one HTTP request, continuing the client's trace; None when the sampler drops it."""
        carrier = {
            name.decode("latin-1"): value.decode("latin-1") for name, value in scope["headers"] if name in TRACE_HEADERS
        }
        parent = self.propagator.extract(carrier) if carrier else None
        method, path = scope["method"], scope["path"]
        span = self.tracer.start_span(
            f"{method} {path}",
            context=parent,
            kind=SpanKind.SERVER,
            attributes={"http.request.method": method, "url.path": path, "poolserve.server": self.server},
        )
        if not span.is_recording():
            return None
        return span

    def end_request(self, span: Span, status: int, request_id: object, error: BaseException | None) -> None:
        span.set_attribute("http.response.status_code", status)
        if isinstance(request_id, str):
            span.set_attribute("poolserve.request_id", request_id)
        if error is not None:
            span.record_exception(error)
        if status >= 500:  # a client's error (4xx) is no server span's error, as OpenTelemetry's HTTP rules say
            span.set_status(Status(StatusCode.ERROR))
        span.end()

    def add_child(
        self,
        parent: Span,
        name: str,
        start_ns: int,
        end_ns: int,
        attributes: Mapping[str, AttributeValue] | None = None,
    ) -> None:
        """A finished step of `parent`, drawn after the fact with the times it took."""
        child = self.tracer.start_span(name, context=context_of(parent), start_time=start_ns, attributes=attributes)
        child.end(end_time=end_ns)

    def add_step(self, parent: Span, name: str, seconds: float) -> None:
        """A step that ended now and took `seconds` (parsing, rendering: timed off the loop)."""
        end_ns = time.time_ns()
        self.add_child(parent, name, end_ns - int(seconds * 1e9), end_ns)

    def add_engine(self, parent: Span, queue_time: float, passes: Iterable[ForwardPass]) -> None:
        """The request's wait for its first forward pass (`queue_time`, seconds before it), then each pass it rode
        in, with the batch's size and tokens."""
        first = True
        for forward in passes:
            if first:
                self.add_child(parent, "engine.queue", forward.start_ns - int(queue_time * 1e9), forward.start_ns)
                first = False
            self.add_child(
                parent,
                "engine.forward",
                forward.start_ns,
                forward.end_ns,
                {
                    "poolserve.batch.inputs": forward.batch_inputs,
                    "poolserve.batch.tokens": forward.batch_tokens,
                    "poolserve.batch.padded_tokens": forward.padded_tokens,
                    "poolserve.batch.request_inputs": forward.request_inputs,
                },
            )

    def shutdown(self) -> None:
        """Send what is queued and stop the export thread (at process exit, off the event loop). A collector that
        does not answer holds it up to the exporter's timeout (OTEL_EXPORTER_OTLP_TIMEOUT, 10 s by default)."""
        self.provider.shutdown()


def context_of(span: Span) -> Context:
    return set_span_in_context(span)
