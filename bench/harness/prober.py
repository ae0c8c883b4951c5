"""The liveness prober: GET /health every 10 ms from its own process, latencies kept for the report.

It runs apart from the load generator so that a busy generator's event loop cannot add its own
lag to what should be the server's answer time.
"""

from __future__ import annotations

import contextlib
import http.client
import multiprocessing
import multiprocessing.connection
import time
from urllib.parse import urlsplit

from bench.harness.stats import count_by, summarize_latencies


def probe_loop(url: str, path: str, interval: float, stop: multiprocessing.connection.Connection) -> None:
    """Probe at fixed ticks until the parent writes to `stop`; reply with the latencies. A tick
    missed because a probe ran long is skipped, not made up for, so a slow server is not flooded."""
    parts = urlsplit(url)
    connection = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port or 80, timeout=10)
    # One probe before measuring, so the connection is made (as a monitor's already is) and the
    # first measured probe is not also a connect.
    with contextlib.suppress(OSError, http.client.HTTPException):
        connection.request("GET", path)
        connection.getresponse().read()
    # (when, latency) and (when, status): CLOCK_MONOTONIC is shared by every process on Linux, so
    # the parent can keep just the probes inside its measured window.
    latencies: list[tuple[float, float]] = []
    statuses: list[tuple[float, str]] = []
    started = time.monotonic()
    tick = 0
    while not stop.poll(0):
        sent = time.perf_counter()
        try:
            connection.request("GET", path)
            response = connection.getresponse()
            response.read()
            latencies.append((time.monotonic(), time.perf_counter() - sent))
            statuses.append((time.monotonic(), str(response.status)))
        except (OSError, http.client.HTTPException) as exc:
            statuses.append((time.monotonic(), type(exc).__name__))
            connection.close()
        tick = max(tick + 1, int((time.monotonic() - started) / interval))
        delay = started + tick * interval - time.monotonic()
        if delay > 0:
            stop.poll(delay)
    stop.send({"latencies": latencies, "statuses": statuses})


class Prober:
    """A child process probing `url + path`; `start()` it beside the load, `finish()` for results."""

    def __init__(self, url: str, path: str = "/health", interval: float = 0.01):
        context = multiprocessing.get_context("spawn")
        self.parent, child = context.Pipe()
        self.process = context.Process(target=probe_loop, args=(url, path, interval, child), daemon=True)

    def start(self) -> None:
        self.process.start()

    def finish(self, window: tuple[float, float]) -> dict[str, object]:
        """Stop probing; summarize the probes that ended within `window` (monotonic seconds)."""
        self.parent.send("stop")
        result: dict[str, list[tuple[float, float]] | list[tuple[float, str]]] = (
            self.parent.recv() if self.parent.poll(30) else {}
        )
        self.process.join(5)
        if self.process.is_alive():
            self.process.kill()
        start, end = window
        latencies = [float(x) for at, x in result.get("latencies", []) if start <= at <= end]
        statuses = [str(x) for at, x in result.get("statuses", []) if start <= at <= end]
        return {
            "latency_ms": summarize_latencies(latencies),
            "statuses": count_by(statuses),
        }
