"""Answered requests leave nothing to Python's cyclic garbage collector: each request's objects go by reference
counting when it ends. A reference cycle per request (the response's view of its transport held its cycle, which held
the view) made an API server run a full collection every ~0.5 s under load, its event loop stopped 11-27 ms each time
(apiserver/connection/response_writes.py; docs/benchmarks.md, "The API server, step 7")."""

from __future__ import annotations

import gc
from collections import Counter

from tests.in_process.stack_server import InProcessServer

REQUESTS = 20
# Where the API server's objects come from; the test's own client and the in-process engine are left out.
API_SIDE = ("uvicorn", "starlette", "apiserver", "engine_client")


def test_answered_requests_leave_no_reference_cycles(server: InProcessServer) -> None:
    body = {"input": "a sentence about reference cycles"}
    with server.client() as client:  # one keep-alive connection: its own objects live on between requests
        assert client.post("/v1/embeddings", json=body).status_code == 200
        gc.collect()
        flags = gc.get_debug()
        gc.set_debug(gc.DEBUG_SAVEALL)  # what the collector finds unreachable is kept in gc.garbage, to be named
        try:
            for _ in range(REQUESTS):
                assert client.post("/v1/embeddings", json=body).status_code == 200
                # A refused request, TEI's route, the probes and the metrics: each path an answer takes.
                assert client.post("/v1/embeddings", json={"input": ""}).status_code == 400
                assert client.post("/embed", json={"inputs": "a sentence"}).status_code == 200
                assert client.get("/health").status_code == 200
                assert client.get("/metrics").status_code == 200
            gc.collect()
            left = Counter(
                f"{type(found).__module__}.{type(found).__qualname__}"
                for found in gc.garbage
                if type(found).__module__.startswith(API_SIDE)
            )
        finally:
            gc.set_debug(flags)
            gc.garbage.clear()
    assert not left, f"objects freed only by the cyclic collector, by type: {dict(left)}"
