"""Steady load: concurrent clients sending requests back to back, every outcome counted, until stopped.

The fault tests and the fault soak (bench/fault_soak.py) run it while they kill, hang or
signal processes, and then account for every request that did not get a 200.
"""

from __future__ import annotations

import random
import threading
import time
from collections import Counter
from collections.abc import Callable

import httpx

from bench.harness.server_process import wait_until

Body = dict[str, object]


class SteadyLoad:
    """Concurrent clients sending requests back to back, counting every outcome, bounded by `stop()`.

    Each client keeps one keep-alive connection (as real clients do) and remembers which API
    server answered it last, so a failure can be traced to the process its connection was on.
    `body` is one request body, or a function of the client's own seeded `random.Random` that
    makes each request's body. `uds`: a Unix socket to connect to instead of `url`'s host and port
    (a proxy in another network namespace).
    """

    def __init__(
        self,
        url: str,
        clients: int = 8,
        body: Body | Callable[[random.Random], Body] | None = None,
        path: str = "/v1/embeddings",
        timeout: float = 60.0,
        *,
        uds: str | None = None,
    ):
        self.url = url
        self.uds = uds
        self.path = path
        self.body = body or {"input": "a steady stream of short sentences"}
        self.clients = clients
        self.timeout = timeout
        self.statuses: Counter[int] = Counter()
        # (server the client's connection was last answered by, exception type name)
        self.failures: list[tuple[str | None, str]] = []
        # (time.monotonic() when it came back, "HTTP <status>" or the exception type name) of every
        # request that did not get a 200, so a failure can be put beside the fault before it.
        self.misses: list[tuple[float, str]] = []
        self.latencies: list[float] = []
        # How many clients have had an answer: until then a client's failure has no server to trace it to.
        self.answered_clients = 0
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads = [
            threading.Thread(target=self._client, args=(random.Random(seed),), daemon=True) for seed in range(clients)
        ]

    def __enter__(self) -> SteadyLoad:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=self.timeout + 10)

    @property
    def total(self) -> int:
        return sum(self.statuses.values()) + len(self.failures)

    def wait_for(self, count: int, timeout: float = 30) -> None:
        """Wait until at least `count` responses came back (load is really flowing)."""
        if not wait_until(lambda: sum(self.statuses.values()) >= count, timeout):
            raise TimeoutError(f"only {dict(self.statuses)} after {timeout}s, wanted {count} responses")

    def wait_for_every_client(self, timeout: float = 30) -> None:
        """Wait until every client has had an answer, so that each one's connection has a known server (on a busy host a
        client's first request can go out long after its thread starts, while it builds its httpx client, and others
        have had many answers by then)."""
        if not wait_until(lambda: self.answered_clients == self.clients, timeout):
            raise TimeoutError(f"only {self.answered_clients} of {self.clients} clients answered after {timeout}s")

    def _client(self, rng: random.Random) -> None:
        last_server: str | None = None
        answered = False
        transport = httpx.HTTPTransport(uds=self.uds) if self.uds else None
        with httpx.Client(base_url=self.url, timeout=self.timeout, transport=transport) as client:
            while not self._stop.is_set():
                body = self.body(rng) if callable(self.body) else self.body
                started = time.perf_counter()
                try:
                    response = client.post(self.path, json=body)
                except httpx.HTTPError as exc:
                    with self._lock:
                        self.failures.append((last_server, type(exc).__name__))
                        self.misses.append((time.monotonic(), type(exc).__name__))
                    continue
                last_server = response.headers.get("x-poolserve-server", last_server)
                with self._lock:
                    if not answered:
                        answered = True
                        self.answered_clients += 1
                    self.statuses[response.status_code] += 1
                    self.latencies.append(time.perf_counter() - started)
                    if response.status_code != 200:
                        self.misses.append((time.monotonic(), f"HTTP {response.status_code}"))
