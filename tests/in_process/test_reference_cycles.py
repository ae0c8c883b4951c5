"""Answered requests leave nothing to Python's cyclic garbage collector: each request's objects, and each closed
connection's, go by reference counting when they end. A reference cycle per request (the response's view of its
transport held its cycle, which held the view) made an API server run a full collection every ~0.5 s under load,
its event loop stopped 11-27 ms each time (apiserver/connection/response_writes.py; docs/benchmarks.md, "The API
server, step 7")."""

from __future__ import annotations

import contextlib
import gc
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import httpx

from bench.harness.scrape import scrape, value
from bench.harness.server_process import wait_until
from tests.images import data_url, encode, make_image
from tests.in_process.stack_server import InProcessServer

REQUESTS = 20
BODY = {"input": "a sentence about reference cycles"}
# The server's own objects (the API server's and the in-process engine's). The test's client is left out, and so is
# asyncio's selector transport, whose stored read callback is a cycle of its own: the API servers run uvloop's.
SERVER_SIDE = ("uvicorn.", "starlette.", "apiserver.", "engine_client.", "engine_core.", "poolserve.")


@contextlib.contextmanager
def cycles() -> Iterator[Callable[[], Counter[str]]]:
    """Yields a function that counts, by type, the server's objects the cyclic collector finds unreachable from
    the start of the block on."""
    gc.collect()
    flags = gc.get_debug()
    gc.set_debug(gc.DEBUG_SAVEALL)  # what it finds is kept in gc.garbage, to be named, rather than freed

    def found() -> Counter[str]:
        gc.collect()
        return Counter(
            f"{type(kept).__module__}.{type(kept).__qualname__}"
            for kept in gc.garbage
            if type(kept).__module__.startswith(SERVER_SIDE)
        )

    try:
        yield found
    finally:
        gc.set_debug(flags)
        gc.garbage.clear()


def post(client: httpx.Client, path: str, body: Any, status: int = 200, **kwargs: Any) -> None:
    response = client.post(path, json=body, **kwargs)
    assert response.status_code == status, response.text


def test_answered_requests_leave_no_reference_cycles(server: InProcessServer) -> None:
    with server.client() as client:  # one keep-alive connection: its own objects live on between requests
        post(client, "/v1/embeddings", BODY)
        with cycles() as found:
            for _ in range(REQUESTS):
                post(client, "/v1/embeddings", BODY)
                # A refused request, TEI's route, a probe and the metrics: each path an answer takes.
                post(client, "/v1/embeddings", {"input": ""}, status=400)
                post(client, "/embed", {"inputs": "a sentence"})
                assert client.get("/health").status_code == 200
                assert client.get("/metrics").status_code == 200
            left = found()
    assert not left, f"objects freed only by the cyclic collector, by type: {dict(left)}"


def open_connections(server: InProcessServer) -> float:
    """The API server's open connections, the scrape's own among them (its one at a time)."""
    return value(scrape(server.url), "poolserve_open_connections")


def test_closed_connections_leave_no_reference_cycles(server: InProcessServer) -> None:
    """A client without keep-alive (a script, a proxy left at its default) opens a connection a request."""
    before = open_connections(server)  # other tests' clients may hold some
    with cycles() as found:
        for _ in range(REQUESTS):
            with server.client() as client:
                post(client, "/v1/embeddings", BODY, headers={"connection": "close"})
        # Closed on the server's side too before the collector looks.
        assert wait_until(lambda: open_connections(server) <= before, 5), (before, open_connections(server))
        left = found()
    assert not left, f"objects freed only by the cyclic collector, by type: {dict(left)}"


def test_reranked_and_image_requests_leave_no_reference_cycles(
    cross_encoder_server: InProcessServer, clip_server: InProcessServer
) -> None:
    """A cross-encoder's pairs and a CLIP model's images and texts: the engine's other runners, the API server's
    image pipeline."""
    image = {"image": data_url(encode(make_image(64, 48, seed=7)))}
    with cross_encoder_server.client() as rerank, clip_server.client() as clip:
        post(rerank, "/rerank", {"query": "q", "texts": ["a", "b"]})
        post(clip, "/v1/embeddings", {"input": [image, "a text"]})
        with cycles() as found:
            for _ in range(REQUESTS // 2):
                post(rerank, "/rerank", {"query": "a query", "texts": ["one document", "another, longer document"]})
                post(clip, "/v1/embeddings", {"input": [image, "a text"]})
            left = found()
    assert not left, f"objects freed only by the cyclic collector, by type: {dict(left)}"
