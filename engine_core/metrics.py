"""The engine's own Prometheus metrics: queueing, batch shapes, forward time, what waits and runs.

Written by the engine process into the supervisor's multiprocess directory, so every API
server's /metrics reports them without relaying anything.
"""

from __future__ import annotations

from bisect import bisect_left
from collections import Counter as Tally
from collections.abc import Sequence

from prometheus_client import Counter, Gauge, Histogram

from poolserve.model_card import ModelCard

TIME_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
COUNT_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
TOKEN_BUCKETS = (16, 64, 256, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072)

QUEUE_SECONDS = Histogram(
    "poolserve_queue_duration_seconds",
    "Time a request waited in the engine between admission and its first forward pass.",
    ["engine", "model"],
    buckets=TIME_BUCKETS,
)
FORWARD_SECONDS = Histogram(
    "poolserve_forward_duration_seconds",
    "Duration of one forward pass of the model, by input modality.",
    ["engine", "model", "modality"],
    buckets=TIME_BUCKETS,
)
BATCH_INPUTS = Histogram(
    "poolserve_batch_inputs",
    "Inputs (texts or images) in one forward pass.",
    ["engine", "model"],
    buckets=COUNT_BUCKETS,
)
BATCH_TOKENS = Histogram(
    "poolserve_batch_tokens",
    "Tokens one forward pass computed, padding included (an image counts its vision tokens).",
    ["engine", "model"],
    buckets=TOKEN_BUCKETS,
)
# Written by the engine alone; a dead engine's values go (mark_process_dead), the live one's stay.
REQUESTS_WAITING = Gauge(
    "poolserve_engine_requests_waiting",
    "Requests admitted by the engine that no forward pass has started yet.",
    ["engine", "model"],
    multiprocess_mode="livemostrecent",
)
REQUESTS_RUNNING = Gauge(
    "poolserve_engine_requests_running",
    "Requests with at least one input computed or computing and not yet answered.",
    ["engine", "model"],
    multiprocess_mode="livemostrecent",
)
INPUTS_QUEUED = Gauge(
    "poolserve_engine_queued_inputs",
    "Inputs waiting or running in the engine: what the admission limit counts.",
    ["engine", "model"],
    multiprocess_mode="livemostrecent",
)
CACHE_HITS = Counter(
    "poolserve_cache_hits",
    "Inputs answered from the engine's cache (--cache-bytes) without a forward pass.",
    ["engine", "model"],
)
CACHE_MISSES = Counter(
    "poolserve_cache_misses",
    "Inputs looked up in the engine's cache and not found (computed, then cached).",
    ["engine", "model"],
)
CACHE_EVICTIONS = Counter(
    "poolserve_cache_evictions",
    "Rows dropped from the engine's cache, least recently used first, to stay within --cache-bytes.",
    ["engine", "model"],
)
CACHE_BYTES = Gauge(
    "poolserve_cache_bytes",
    "Bytes the engine's cache holds (rows and their bookkeeping), at most --cache-bytes.",
    ["engine", "model"],
    multiprocess_mode="livemostrecent",
)
# Labelled with the served name, not card.path: /metrics is open to anyone who can reach the port
# (unless --protect-metrics), and a filesystem path tells them how the host is laid out.
MODEL_INFO = Gauge(
    "poolserve_model_info",
    "The model the engine serves (always 1; the facts are labels).",
    ["engine", "model_name", "architecture", "kind", "pooling", "device", "dtype", "max_model_len", "output_size"],
    multiprocess_mode="livemostrecent",
)


# Which engine this process is, and whose model it serves: every series here carries them as its `engine` and
# `model` labels (the engine's number across every model's engines; the model's served name), so /metrics shows each
# engine's and each model's figures (sum them for the server's). Set once at start-up.
_labels = ("0", "")


def set_engine_index(index: int, model: str) -> None:
    global _labels
    _labels = (str(index), model)
    # Each series exists from start-up, at 0 (as Prometheus advises), and takes its room in the metric
    # files now, before a full disk could refuse it (poolserve/metric_files.py).
    for metric in (
        QUEUE_SECONDS,
        BATCH_INPUTS,
        BATCH_TOKENS,
        REQUESTS_WAITING,
        REQUESTS_RUNNING,
        INPUTS_QUEUED,
        CACHE_HITS,
        CACHE_MISSES,
        CACHE_EVICTIONS,
        CACHE_BYTES,
    ):
        metric.labels(*_labels)


def engine_labels() -> tuple[str, str]:
    """This engine's (`engine`, `model`) label values, the first labels of every series here."""
    return _labels


def publish_model_info(card: ModelCard, *, model_name: str) -> None:
    MODEL_INFO.labels(
        engine=_labels[0],
        model_name=model_name,
        architecture=card.architecture,
        kind=card.kind,
        pooling=card.pooling,
        device=card.device,
        dtype=card.dtype,
        max_model_len=str(card.max_model_len),
        output_size=str(card.output_size),
    ).set(1)


def observe_all(histogram: Histogram, amounts: Sequence[float]) -> None:
    """Each of `amounts` observed in `histogram` (a labelled child), as `observe` would one by one, at one write
    to the metric file per bucket it touches: observe writes twice for every value (its bucket and the sum), and a
    batch of short requests has a queue time for each. Falls back to `observe` where prometheus_client keeps its
    histograms otherwise than it does today (tests/engine_core/test_metrics.py compares the two)."""
    buckets, bounds = getattr(histogram, "_buckets", None), getattr(histogram, "_upper_bounds", None)
    if buckets is None or bounds is None or getattr(histogram, "_sum", None) is None:
        for amount in amounts:
            histogram.observe(amount)
        return
    if not amounts:
        return
    # observe counts a value in the first bucket whose upper bound is at least the value (the last is +Inf).
    for index, count in Tally(bisect_left(bounds, amount) for amount in amounts).items():
        buckets[index].inc(count)
    histogram._sum.inc(sum(amounts))
