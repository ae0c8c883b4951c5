"""OpenTelemetry traces from the API server and engine of `launch` (stack_server.py), received by an OTLP/HTTP
endpoint the test runs (bench/otlp_sink.py, which decodes each export with opentelemetry-proto): the client's trace
continued, the request's steps as child spans, the engine's forward passes (across the ZeroMQ wire) with their
batches, sampling by the client's flag and by ratio, and the spans sent when the server stops."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from bench.otlp_sink import OtlpReceiver, ReceivedSpan
from tests.in_process.stack_server import InProcessServer
from tests.utils import FLOAT32_CPU

CLIENT_TRACE = "0af7651916cd43dd8448eb211c80319c"
CLIENT_SPAN = "b7ad6b7169203331"
BAD_BODY_TRACE = "1af7651916cd43dd8448eb211c80319c"
UNSAMPLED_TRACE = "2af7651916cd43dd8448eb211c80319c"
SERVER_SPAN_KIND = 2  # OTLP's SPAN_KIND_SERVER
ERROR_STATUS = 2  # OTLP's STATUS_CODE_ERROR
# The engine's times and the API server's are read on two threads (in two processes under `launch`): a little slack.
SLACK_NS = 2_000_000


@pytest.fixture(scope="module")
def traced() -> Iterator[tuple[list[ReceivedSpan], dict[str, str]]]:
    """A server that keeps its spans until it stops (a minute's export delay: only the shutdown's flush sends
    them), samples parent-based at ratio 0 (only a client's sampled trace is traced), and takes four requests:
    one in the client's sampled trace, a bad one in another sampled trace, one in a trace the client did not
    sample, and one with no trace. What the receiver holds once the server has stopped, and the first's headers."""
    receiver = OtlpReceiver().start()
    env = {
        "OTEL_SERVICE_NAME": "embedder-under-test",
        "OTEL_TRACES_SAMPLER": "parentbased_traceidratio",
        "OTEL_TRACES_SAMPLER_ARG": "0",
        "OTEL_BSP_SCHEDULE_DELAY": "60000",
    }
    server = InProcessServer("--otlp-endpoint", receiver.url, *FLOAT32_CPU, env=env)
    try:
        server.start()
        with server.client() as client:
            answer = client.post(
                "/v1/embeddings",
                json={"input": ["hello world", "a longer sentence than the others", "hi"]},
                headers={"traceparent": f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"},
            )
            assert answer.status_code == 200, answer.text
            bad = client.post(
                "/v1/embeddings", content=b"{", headers={"traceparent": f"00-{BAD_BODY_TRACE}-{CLIENT_SPAN}-01"}
            )
            assert bad.status_code == 400
            for headers in ({"traceparent": f"00-{UNSAMPLED_TRACE}-{CLIENT_SPAN}-00"}, {}):
                assert client.post("/v1/embeddings", json={"input": "hello"}, headers=headers).status_code == 200
        assert receiver.spans() == []  # nothing sent yet: the export waits a minute
    finally:
        server.stop()
        receiver.stop()
    yield receiver.spans(), dict(answer.headers)


def test_a_request_continues_the_clients_trace_with_its_steps_as_child_spans(
    traced: tuple[list[ReceivedSpan], dict[str, str]],
) -> None:
    spans, headers = traced
    mine = [span for span in spans if span.trace_id == CLIENT_TRACE]
    roots = [span for span in mine if span.name == "POST /v1/embeddings"]
    assert len(roots) == 1, [span.name for span in mine]
    root = roots[0]
    assert root.parent_span_id == CLIENT_SPAN and root.kind == SERVER_SPAN_KIND
    assert root.resource["service.name"] == "embedder-under-test"
    assert root.attributes["http.route"] == "/v1/embeddings"
    assert root.attributes["http.response.status_code"] == 200
    assert root.attributes["poolserve.model"] == "sentence-transformers/all-MiniLM-L6-v2"
    assert root.attributes["poolserve.inputs"] == 3
    assert root.attributes["poolserve.tokens"] == int(headers["x-compute-tokens"])
    assert root.attributes["poolserve.request_id"] == headers["x-request-id"]
    children = [span for span in mine if span is not root]
    assert all(span.parent_span_id == root.span_id for span in children)
    names = [span.name for span in sorted(children, key=lambda span: span.start_ns)]
    forwards = [span for span in children if span.name == "engine.forward"]
    assert names == ["parse", "engine.queue", *["engine.forward"] * len(forwards), "render"]
    # Every input rode in a pass; each pass's batch holds at least the request's inputs, with their tokens.
    assert sum(span.attributes["poolserve.batch.request_inputs"] for span in forwards) == 3
    for span in forwards:
        assert span.attributes["poolserve.batch.inputs"] >= span.attributes["poolserve.batch.request_inputs"] >= 1
        assert span.attributes["poolserve.batch.padded_tokens"] >= span.attributes["poolserve.batch.tokens"] >= 3
    assert sum(span.attributes["poolserve.batch.tokens"] for span in forwards) >= root.attributes["poolserve.tokens"]
    # The steps in order, within the request's span.
    by_name = {span.name: span for span in children}
    parse, queue, render = by_name["parse"], by_name["engine.queue"], by_name["render"]
    assert root.start_ns <= parse.start_ns <= parse.end_ns <= queue.start_ns + SLACK_NS
    assert queue.end_ns == min(span.start_ns for span in forwards)
    assert max(span.end_ns for span in forwards) <= render.start_ns + SLACK_NS
    assert render.end_ns <= root.end_ns


def test_sampling_follows_the_clients_flag_and_the_ratio(traced: tuple[list[ReceivedSpan], dict[str, str]]) -> None:
    spans, _ = traced
    # The client's sampled traces are traced at ratio 0 (parent-based); its unsampled one and the request with no
    # trace are not.
    assert {span.trace_id for span in spans} == {CLIENT_TRACE, BAD_BODY_TRACE}


def test_a_refused_request_is_traced_with_its_status_and_no_engine_span(
    traced: tuple[list[ReceivedSpan], dict[str, str]],
) -> None:
    spans, _ = traced
    refused = {span.name: span for span in spans if span.trace_id == BAD_BODY_TRACE}
    assert sorted(refused) == ["POST /v1/embeddings", "parse"]  # parsing ran and refused it; nothing reached the engine
    root = refused["POST /v1/embeddings"]
    assert root.attributes["http.response.status_code"] == 400
    assert root.status_code != ERROR_STATUS  # a client's error is not the server's
