"""Who the engine serves first, on the real engine (stack_server.py: its own thread, as in its process): round robin
between requests, and `priority`."""

from __future__ import annotations

import statistics
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx

from tests.in_process.stack_server import InProcessServer
from tests.sentences import SENTENCES

QUERY = {"input": "how do I reset my password"}


def timed_post(client: httpx.Client, body: dict[str, object]) -> float:
    started = time.perf_counter()
    response = client.post("/v1/embeddings", json=body)
    assert response.status_code == 200, response.text
    return time.perf_counter() - started


def test_a_small_request_is_answered_while_a_2048_input_request_runs(server: InProcessServer) -> None:
    # Once first come, first served: the one sentence waited for all 2048 inputs ahead of it (~5 s here).
    big = {"input": [SENTENCES[i % len(SENTENCES)] for i in range(2048)]}
    took: list[float] = []
    with server.client() as client:
        timed_post(client, QUERY)  # warm

        def send_big() -> None:
            with server.client() as big_client:
                took.append(timed_post(big_client, big))

        sender = threading.Thread(target=send_big)
        sender.start()
        time.sleep(0.5)  # the big request is in the engine, its first windows planned
        small = timed_post(client, QUERY)
        small_before_big = not took
        sender.join()
    assert small_before_big
    # It waits for the window being run and its turn in the next (4 batches of at most 32 inputs
    # each), not for the 2048 inputs: a small part of the big request's time, however loaded the machine.
    assert small < 0.25 * took[0], f"{small:.2f}s for one sentence, {took[0]:.2f}s for the 2048 ahead of it"


def test_an_urgent_query_overtakes_bulk_work_and_the_bulk_work_all_completes(server: InProcessServer) -> None:
    bulk = {"input": [SENTENCES[i % len(SENTENCES)] for i in range(64)]}
    stop = threading.Event()
    completed = []

    def bulk_client() -> None:
        with server.client() as client:
            while not stop.is_set():
                timed_post(client, bulk)
                completed.append(1)

    latencies: dict[int, list[float]] = {0: [], -1: []}
    with ThreadPoolExecutor(4) as pool:
        workers = [pool.submit(bulk_client) for _ in range(4)]
        try:
            time.sleep(1.0)  # the engine saturated: four 64-input requests always waiting
            with server.client() as client:
                for _ in range(4):
                    for priority in (0, -1):
                        latencies[priority].append(timed_post(client, {**QUERY, "priority": priority}))
                        time.sleep(0.1)
        finally:
            stop.set()
        for worker in workers:
            worker.result()  # every bulk request was answered 200: none starved or failed
    assert len(completed) >= 8
    default, urgent = statistics.median(latencies[0]), statistics.median(latencies[-1])
    # At priority 0 the query waits its turn among the bulk requests (a window or more); at -1 it
    # displaces the window being run and goes in the next batch.
    assert urgent < 0.6 * default, f"priority -1: {latencies[-1]}, priority 0: {latencies[0]}"
