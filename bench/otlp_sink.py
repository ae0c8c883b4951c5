"""A minimal OTLP/HTTP trace receiver: decodes each ExportTraceServiceRequest with opentelemetry-proto and keeps its
spans. The collector for measuring tracing's cost (bench.variants with --otlp-endpoint) and for the tests that read
what a server sent.

    python -m bench.otlp_sink --port 4318 [--no-decode]   # serves until SIGTERM; then prints what it received

--no-decode only counts the exports and their bytes: a collector runs on its own machine, so when the sink shares
the measured server's cores, decoding would bill the server's host for the collector's work.
"""

from __future__ import annotations

import argparse
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)


@dataclass(frozen=True)
class ReceivedSpan:
    """One span as it arrived, with its resource's attributes; ids as hex, attributes as plain values."""

    name: str
    trace_id: str
    span_id: str
    parent_span_id: str
    kind: int
    start_ns: int
    end_ns: int
    attributes: dict[str, Any]
    resource: dict[str, Any]
    status_code: int


def plain(value: Any) -> Any:
    """An OTLP AnyValue as the Python value it holds."""
    kind = value.WhichOneof("value")
    return None if kind is None else getattr(value, kind)


def attributes_of(pairs: Any) -> dict[str, Any]:
    return {pair.key: plain(pair.value) for pair in pairs}


def spans_of(body: bytes) -> list[ReceivedSpan]:
    request = ExportTraceServiceRequest()
    request.ParseFromString(body)
    spans = []
    for resource_spans in request.resource_spans:
        resource = attributes_of(resource_spans.resource.attributes)
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                spans.append(
                    ReceivedSpan(
                        span.name, span.trace_id.hex(), span.span_id.hex(), span.parent_span_id.hex(), span.kind,
                        span.start_time_unix_nano, span.end_time_unix_nano, attributes_of(span.attributes), resource,
                        span.status.code,
                    )
                )  # fmt: skip
    return spans


class OtlpReceiver:
    """Listens on 127.0.0.1 (`port` 0: a free one) in a thread; POST /v1/traces bodies are decoded and kept."""

    def __init__(self, port: int = 0, *, decodes: bool = True):
        self._spans: list[ReceivedSpan] = []
        self._lock = threading.Lock()
        self.posts = 0
        self.bytes = 0
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length", 0)))
                status = 404
                if self.path == "/v1/traces":
                    spans = spans_of(body) if decodes else []
                    with receiver._lock:
                        receiver._spans.extend(spans)
                        receiver.posts += 1
                        receiver.bytes += len(body)
                    status = 200
                answer = ExportTraceServiceResponse().SerializeToString()
                self.send_response(status)
                self.send_header("content-type", "application/x-protobuf")
                self.send_header("content-length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, format: str, *args: Any) -> None:  # one line per export would drown the output
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, name="otlp-receiver", daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def start(self) -> OtlpReceiver:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def spans(self) -> list[ReceivedSpan]:
        with self._lock:
            return list(self._spans)

    def wait_for(self, predicate: Callable[[list[ReceivedSpan]], bool], timeout: float) -> list[ReceivedSpan]:
        """The spans received once `predicate` holds for them, or all of them when `timeout` passes first."""
        deadline = time.monotonic() + timeout
        while not predicate(spans := self.spans()) and time.monotonic() < deadline:
            time.sleep(0.05)
        return spans


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--port", type=int, default=4318)
    parser.add_argument("--no-decode", action="store_true", help="Count exports and bytes only.")
    args = parser.parse_args()
    receiver = OtlpReceiver(args.port, decodes=not args.no_decode).start()
    print(f"receiving OTLP/HTTP traces at {receiver.url}/v1/traces", flush=True)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda signum, frame: stop.set())
    signal.signal(signal.SIGINT, lambda signum, frame: stop.set())
    stop.wait()
    receiver.stop()
    spans = receiver.spans()
    print(
        f"{receiver.posts} exports, {receiver.bytes} bytes; decoded: {len(spans)} spans, "
        f"{len({span.trace_id for span in spans})} traces",
        flush=True,
    )


if __name__ == "__main__":
    main()
