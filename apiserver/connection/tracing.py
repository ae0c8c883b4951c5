"""Whether this API server traces, and the middleware that opens each request's span: light, so that a server
without tracing imports none of OpenTelemetry (apiserver/connection/request_tracer.py holds the SDK's side)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from poolserve.config import Config

if TYPE_CHECKING:
    from apiserver.connection.request_tracer import RequestTracer

# The key of a traced request's span in its ASGI state (absent: the request is not traced).
TRACE_SPAN = "trace_span"


def start_tracing(config: Config, server_index: int) -> RequestTracer | None:
    """The process's tracer when --otlp-endpoint (or OTEL_EXPORTER_OTLP_ENDPOINT) is set; None otherwise, at no
    cost: no SDK imported, no export thread, no middleware, and the request cycle's one check finds no span."""
    if not config.otlp_endpoint:
        return None
    from apiserver.connection.request_tracer import RequestTracer

    return RequestTracer(config, server_index)


class TraceRequests:
    """ASGI middleware, in the stack only when tracing is on: opens each POST request's span (the request cycle
    adds its steps, finding it in the request's state) and closes it with the answer's status."""

    def __init__(self, app: ASGIApp, *, tracer: RequestTracer):
        self.app = app
        self.tracer = tracer

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        # GETs are probes, scrapes and lists (/health, /metrics, /v1/models): thousands of spans that say nothing.
        span = self.tracer.start_request(scope) if scope["type"] == "http" and scope["method"] == "POST" else None
        if span is None:
            await self.app(scope, receive, send)
            return
        state = scope.setdefault("state", {})
        state[TRACE_SPAN] = span
        status = 500  # what Starlette answers when the app raises before its answer starts
        error: BaseException | None = None

        async def send_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_status)
        except BaseException as exc:
            error = exc
            raise
        finally:
            self.tracer.end_request(span, status, state.get("request_id"), error)
