"""The API servers' Prometheus metrics, and /metrics, which reports the whole server from any process.

Every process (API servers, engine, supervisor) writes its series into the supervisor's
multiprocess directory; a scrape that lands on any API server reads them all, so totals are the
same whichever process the kernel hands the connection to. A file that does not parse (a
foreign or damaged *.db) is left out of the scrape rather than failing it: logged once per
file and process, and shown in poolserve_metric_files_unreadable.
"""

from __future__ import annotations

import asyncio
import functools
import glob
import logging
import os
from collections.abc import Iterable
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.multiprocess import MultiProcessCollector
from starlette.requests import Request
from starlette.responses import Response

from poolserve.metric_archive import folder_lock

TIME_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
LAG_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)
LAG_SAMPLE_INTERVAL_S = 0.25

logger = logging.getLogger(__name__)

# The key of a request's scope state that names the model answering it (its served name), once picked: the `model`
# label of the request's series.
MODEL = "model"

# `model`: the served name of the model that answered the request (its `model` field's, else the default); empty
# for a request no model answered (/health, /metrics, an unknown model's 404, a body that does not decode).
REQUESTS = Counter(
    "poolserve_requests", "HTTP requests answered, by endpoint, status code and model.", ["endpoint", "status", "model"]
)
REQUEST_SECONDS = Histogram(
    "poolserve_request_duration_seconds",
    "End-to-end time of a request in an API server, by endpoint and model.",
    ["endpoint", "model"],
    buckets=TIME_BUCKETS,
)
# Parsing a request (request_cycle.py's PARSING), under the metric's published name.
PARSE_SECONDS = Histogram(
    "poolserve_preprocess_duration_seconds",
    "Time spent decoding the request, tokenizing and decoding images, by endpoint and model.",
    ["endpoint", "model"],
    buckets=TIME_BUCKETS,
)
ENCODE_SECONDS = Histogram(
    "poolserve_encode_duration_seconds",
    "Time spent encoding the response (rows into JSON), by endpoint and model.",
    ["endpoint", "model"],
    buckets=TIME_BUCKETS,
)
PROMPT_TOKENS = Counter(
    "poolserve_prompt_tokens", "Tokens sent to the model, by endpoint and model.", ["endpoint", "model"]
)
IMAGES = Counter("poolserve_images", "Images sent to the model, by endpoint and model.", ["endpoint", "model"])
SERVER_REQUESTS = Counter(
    "poolserve_api_server_requests", "HTTP requests answered by each API-server process (index).", ["server"]
)
OPEN_CONNECTIONS = Gauge(
    "poolserve_open_connections",
    "HTTP connections each API server (index) holds open now.",
    ["server"],
    multiprocess_mode="livesum",
)
CONNECTIONS = Counter("poolserve_connections", "HTTP connections each API server (index) accepted.", ["server"])
ACCEPT_PAUSES = Counter(
    "poolserve_accept_pauses",
    "Times an API server (index) stopped accepting because it held more than its share (fair accept).",
    ["server"],
)
ACCEPT_TAKEOVERS = Counter(
    "poolserve_accept_takeovers",
    "Connections an API server (index) accepted while over its share, because one had waited in the listen "
    "queue for 20 ms (the sibling that should have taken it was busy or stuck).",
    ["server"],
)
CONNECTIONS_RECYCLED = Counter(
    "poolserve_connections_recycled",
    "Keep-alive connections an API server (index) closed after a response (`Connection: close`) because they "
    "reached --max-requests-per-connection (reason=requests) or --max-connection-age (reason=age).",
    ["server", "reason"],
)
CONNECTIONS_TIMED_OUT = Counter(
    "poolserve_connections_timed_out",
    "Connections an API server (index) closed because the client was too slow: the request's head past "
    "--header-timeout (reason=header), a gap in its body past --body-timeout (reason=body), or idle between "
    "requests past --keep-alive-timeout (reason=idle), or an answer left unread past --send-timeout (reason=send).",
    ["server", "reason"],
)
CONNECTIONS_REFUSED = Counter(
    "poolserve_connections_refused",
    "Connections an API server (index) refused: answered 503 because every API server held "
    "--max-connections-per-server (reason=full), or left queued because accept() failed for lack of file "
    "descriptors or memory (reason=emfile, enfile, enobufs, enomem).",
    ["server", "reason"],
)
BODY_BYTES_IN_FLIGHT = Gauge(
    "poolserve_request_body_bytes_in_flight",
    "Bytes of request bodies each API server (index) has let in and not let go (--max-body-bytes-in-flight).",
    ["server"],
    multiprocess_mode="livesum",
)
BODIES_REFUSED = Counter(
    "poolserve_request_bodies_refused",
    "Requests an API server (index) refused with 503 too_many_uploads, unread, because the bodies it held "
    "would have passed --max-body-bytes-in-flight.",
    ["server"],
)
LOOP_LAG = Histogram(
    "poolserve_event_loop_lag_seconds",
    "How late an API server's event loop ran a timer (sampled every 0.25 s): what load does to liveness.",
    ["server"],
    buckets=LAG_BUCKETS,
)

METRIC_FILES_UNREADABLE = Gauge(
    "poolserve_metric_files_unreadable",
    "Files in the metrics folder the latest scrape left out because they do not parse (damaged or foreign).",
    multiprocess_mode="livemostrecent",  # what the latest scrape found, whichever API server ran it
)
# Files already logged as unreadable by this process: one line per file, however often it is scraped.
logged_unreadable: set[str] = set()


class ReadableFilesCollector:
    """prometheus_client's MultiProcessCollector over the folder's files that parse: one unreadable file
    would otherwise make every scrape a 500."""

    def __init__(self, path: str):
        self.path = path

    def collect(self) -> Iterable[Metric]:
        # Shared with other scrapes, exclusive of the supervisor folding a dead process's files into the archives
        # (poolserve/metric_archive.py): no file is read both folded and unfolded.
        with folder_lock(self.path, exclusive=False):
            return self._collect()

    def _collect(self) -> Iterable[Metric]:
        readable = []
        unreadable = 0
        for path in glob.glob(os.path.join(self.path, "*.db")):
            try:
                MultiProcessCollector._read_metrics([path])  # type: ignore[no-untyped-call]
            except FileNotFoundError:  # removed since the glob (a dead process's live gauge)
                continue
            except Exception as exc:  # a file's bytes can be anything: whatever parsing them raises
                unreadable += 1
                if path not in logged_unreadable:
                    logged_unreadable.add(path)
                    logger.warning("metrics: left out %s, which does not parse: %r", path, exc)
                continue
            readable.append(path)
        METRIC_FILES_UNREADABLE.set(unreadable)
        return MultiProcessCollector.merge(readable, accumulate=True)  # type: ignore[no-any-return,no-untyped-call]


@functools.cache
def series(metric: Any, *values: str) -> Any:
    """`metric`'s child for these label values (in the metric's label order), looked up once per process:
    `labels()` builds and checks the key each call (~3 µs, several times a request). Only for label values
    from a small fixed set (endpoints, status codes, server indexes)."""
    return metric.labels(*values)


def registry() -> CollectorRegistry:
    """All processes' series when running under the supervisor, else this process's own."""
    if "PROMETHEUS_MULTIPROC_DIR" not in os.environ:
        from prometheus_client import REGISTRY

        return REGISTRY
    collecting = CollectorRegistry()
    collecting.register(ReadableFilesCollector(os.environ["PROMETHEUS_MULTIPROC_DIR"]))
    return collecting


async def get_metrics(request: Request) -> Response:
    return Response(generate_latest(registry()), media_type=CONTENT_TYPE_LATEST)


async def sample_loop_lag(server_index: int) -> None:
    """A timer that measures its own lateness: time the loop spent not getting back to it."""
    loop = asyncio.get_running_loop()
    histogram = LOOP_LAG.labels(server=str(server_index))
    while True:
        expected = loop.time() + LAG_SAMPLE_INTERVAL_S
        await asyncio.sleep(LAG_SAMPLE_INTERVAL_S)
        histogram.observe(max(0.0, loop.time() - expected))
