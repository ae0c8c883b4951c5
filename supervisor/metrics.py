"""The supervisor's Prometheus metrics: restarts and how many API servers serve.

Imported only after the supervisor has set PROMETHEUS_MULTIPROC_DIR (prometheus_client picks
its storage when first imported).
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge
from prometheus_client.multiprocess import mark_process_dead

RESTARTS = Counter(
    "poolserve_restarts",
    "Processes restarted after they stopped unexpectedly (crash, kill, missed heartbeats).",
    ["process"],
)
API_SERVERS = Gauge(
    "poolserve_api_servers",
    "API-server processes serving now (ready and not draining).",
    multiprocess_mode="livemostrecent",
)

ENGINES_OUT_OF_SERVICE = Gauge(
    "poolserve_engine_out_of_service",
    "1 while an engine is taken out of service for crashing again and again (--engine-count > 1; the others "
    "serve), else 0; by engine and its model's served name.",
    ["engine", "model"],
    multiprocess_mode="livemostrecent",
)

__all__ = ["API_SERVERS", "ENGINES_OUT_OF_SERVICE", "RESTARTS", "mark_process_dead"]
