"""/metrics tells the truth for the whole server, whichever API server answers the scrape."""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from bench.harness.scrape import scrape, value
from bench.harness.server_process import PoolserveProcess, wait_until
from bench.harness.steady_load import SteadyLoad
from poolserve.config import BUNDLED_MODEL_NAME
from tests.utils import ready_line_time

EMBEDDINGS_200 = ("poolserve_requests_total", {"endpoint": "/v1/embeddings", "status": "200"})


@pytest.fixture(scope="module")
def metered(recycling_server: PoolserveProcess) -> PoolserveProcess:
    """2 API servers with the access log on, whose keep-alive connections close after 3 requests or 2 s, so that the
    dashboard test's load recycles some whatever the host's speed (at the default 1000 it did only on a fast run, and
    the 'Connections recycled' panel then had no series): tests/e2e/conftest.py's, shared with
    test_connection_spread.py. The tests here read what they add to its counts."""
    return recycling_server


def tool(name: str) -> str:
    """promtool and prometheus, from Debian's `prometheus` package (`make test-tools` installs it)."""
    path = shutil.which(name)
    if path is None:
        pytest.skip(f"{name} is not installed: `make test-tools` installs Debian's prometheus package (as root)")
    return path


def test_every_scrape_reports_the_whole_servers_count_whichever_process_answers(metered: PoolserveProcess) -> None:
    before = value(scrape(metered.url), *EMBEDDINGS_200[:1], **EMBEDDINGS_200[1])
    answered_by: set[str] = set()
    requests = 60
    for i in range(requests):
        with httpx.Client(base_url=metered.url, timeout=30) as client:  # new connections spread the load
            response = client.post("/v1/embeddings", json={"input": f"counted request {i}"})
            assert response.status_code == 200
            answered_by.add(response.headers["x-poolserve-server"])
    assert answered_by == {"0", "1"}
    counts = [value(scrape(metered.url), *EMBEDDINGS_200[:1], **EMBEDDINGS_200[1]) - before for _ in range(10)]
    assert counts == [requests] * 10
    samples = scrape(metered.url)
    per_server = [value(samples, "poolserve_api_server_requests_total", server=s) for s in ("0", "1")]
    assert all(count > 0 for count in per_server)


def test_the_exposition_passes_promtool(metered: PoolserveProcess) -> None:
    promtool = tool("promtool")
    with httpx.Client(base_url=metered.url, timeout=10) as client:
        client.post("/v1/embeddings", json={"input": "so that every family has samples"})
        text = client.get("/metrics").text
    checked = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True, check=False)
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_histograms_move_under_load_and_gauges_return_to_zero(metered: PoolserveProcess) -> None:
    before = scrape(metered.url)
    body = {"input": [f"load sentence {i} for the histograms" for i in range(8)]}
    with SteadyLoad(metered.url, clients=4, body=body) as load:
        load.wait_for(30)
        during = scrape(metered.url)
    after_idle = {}

    def idle() -> bool:
        after_idle.update(scrape(metered.url))
        return (
            value(after_idle, "poolserve_engine_requests_waiting", engine="0") == 0
            and value(after_idle, "poolserve_engine_requests_running", engine="0") == 0
            and value(after_idle, "poolserve_engine_queued_inputs", engine="0") == 0
        )

    assert wait_until(idle, 10), after_idle
    for name in (
        "poolserve_queue_duration_seconds_count",
        "poolserve_batch_inputs_count",
        "poolserve_batch_tokens_count",
    ):
        assert value(during, name, engine="0") > value(before, name, engine="0"), name
    assert value(during, "poolserve_forward_duration_seconds_count", engine="0", modality="text") > value(
        before, "poolserve_forward_duration_seconds_count", engine="0", modality="text"
    )
    assert value(during, "poolserve_request_duration_seconds_count", endpoint="/v1/embeddings") > value(
        before, "poolserve_request_duration_seconds_count", endpoint="/v1/embeddings"
    )
    assert value(during, "poolserve_prompt_tokens_total", endpoint="/v1/embeddings") > value(
        before, "poolserve_prompt_tokens_total", endpoint="/v1/embeddings"
    )
    assert value(during, "poolserve_preprocess_duration_seconds_count", endpoint="/v1/embeddings") > 0
    assert value(during, "poolserve_event_loop_lag_seconds_count", server="0") > 0
    assert value(after_idle, "poolserve_api_servers") == 2
    info = [key for key in after_idle if key[0] == "poolserve_model_info"]
    assert len(info) == 1 and dict(info[0][1])["architecture"] == "BertModel"
    # The served name, never the model's filesystem path: /metrics is open without the API key.
    assert dict(info[0][1])["model_name"] == BUNDLED_MODEL_NAME
    assert not any(label.startswith("/") for _, label in info[0][1])


def test_timing_headers_request_ids_and_the_access_log(metered: PoolserveProcess) -> None:
    with metered.client() as client:
        body = {"input": "timed", "user": "alice"}  # OpenAI's end-user id: the access log shows it
        response = client.post("/v1/embeddings", json=body, headers={"x-request-id": "trace-42"})
    headers = response.headers
    assert headers["x-request-id"] == "trace-42"
    for name in ("x-total-time", "x-tokenization-time", "x-queue-time", "x-inference-time"):
        assert float(headers[name]) >= 0, name
    assert float(headers["x-total-time"]) >= float(headers["x-inference-time"])
    assert headers["x-compute-tokens"] == "3"  # [CLS] timed [SEP]
    assert wait_until(lambda: "request_id=trace-42 method=POST path=/v1/embeddings status=200" in metered.stderr(), 5)
    assert re.search(r"request_id=trace-42 .* tokens=3 user=\"alice\"", metered.stderr())


def test_restarts_are_counted_and_a_dead_process_leaves_no_gauge_series(server: PoolserveProcess) -> None:
    """On the session's server (tests/conftest.py), whose counts are the whole session's: what the kill adds."""
    before = scrape(server.url)
    (engine,) = server.child_pid("engine_core")
    mark = len(server.stderr())
    os.kill(engine, signal.SIGKILL)
    ready_line_time(server, "engine", engine, timeout=60, since=mark)
    with server.client() as client:
        assert wait_until(lambda: client.get("/health").status_code == 200, 30)
    samples = scrape(server.url)
    for process, added in (("engine", 1), ("api_server", 0)):
        restarts = value(samples, "poolserve_restarts_total", process=process)
        assert restarts - value(before, "poolserve_restarts_total", process=process) == added, process
    waiting = [key for key in samples if key[0] == "poolserve_engine_requests_waiting"]
    assert waiting == [("poolserve_engine_requests_waiting", (("engine", "0"), ("model", BUNDLED_MODEL_NAME)))]
    assert len([key for key in samples if key[0] == "poolserve_model_info"]) == 1
    # The dead engine's files are folded into the archives and gone: the folder does not grow with restarts
    # (its counters stay in the totals, as the restart count above read through them shows).
    folder = metrics_folder(server)
    assert not list(folder.glob(f"*_{engine}.db")) and not list(folder.glob(f"*-{engine}.db"))
    assert (folder / "counter_archive.db").exists()


# JSON logs, one object per line from every process: tests/e2e/test_faults.py's SIGTERM test, on its own launch.


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(scope="module")
def prometheus(metered: PoolserveProcess, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real Prometheus scraping the server every second; its URL. One for the module's tests: each start took
    3-5 s of the suite."""
    folder = tmp_path_factory.mktemp("prometheus")
    (folder / "prometheus.yml").write_text(
        "global:\n  scrape_interval: 1s\n"
        "scrape_configs:\n  - job_name: poolserve\n    honor_labels: true\n    static_configs:\n"
        f"      - targets: ['127.0.0.1:{metered.port}']\n"
    )
    port = free_port()
    proc = subprocess.Popen(
        [
            tool("prometheus"),
            f"--config.file={folder / 'prometheus.yml'}",
            f"--storage.tsdb.path={folder / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"

    def ready() -> bool:
        # Until its storage is open Prometheus answers queries with a plain-text 503 "Service Unavailable".
        try:
            return httpx.get(f"{url}/-/ready", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    try:
        assert wait_until(ready, 30, interval=0.1), "Prometheus did not become ready in 30 s"
        yield url
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)
        time.sleep(0.1)


def test_a_real_prometheus_server_scrapes_the_request_counter(metered: PoolserveProcess, prometheus: str) -> None:
    with metered.client() as client:
        for _ in range(5):
            assert client.post("/v1/embeddings", json={"input": "scraped"}).status_code == 200
    expected = value(scrape(metered.url), *EMBEDDINGS_200[:1], **EMBEDDINGS_200[1])
    query = 'poolserve_requests_total{endpoint="/v1/embeddings",status="200"}'
    seen: list[float] = []

    def scraped() -> bool:
        try:
            result = httpx.get(f"{prometheus}/api/v1/query", params={"query": query}, timeout=5).json()
        except httpx.HTTPError:
            return False
        seen[:] = [float(r["value"][1]) for r in result.get("data", {}).get("result", [])]
        return seen == [expected]

    assert wait_until(scraped, 30, interval=0.5), f"Prometheus saw {seen}, expected [{expected}]"


def test_a_client_that_leaves_mid_body_is_logged_quietly_and_counted_as_a_disconnect(metered: PoolserveProcess) -> None:
    # Once an ERROR with a traceback, counted as a 500: the server's fault in the dashboards.
    before = scrape(metered.url)
    log_start = len(metered.stderr())
    head = (
        b"POST /v1/embeddings HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        b"Content-Length: 100000\r\n\r\n"
    )
    for _ in range(4):  # new connections: each API server gets some
        with socket.create_connection(("127.0.0.1", metered.port), timeout=10) as conn:
            conn.sendall(head + b'{"input": ')
            time.sleep(0.2)  # the request reaches the route, which waits for the rest of the body
    assert wait_until(
        lambda: (
            value(scrape(metered.url), "poolserve_requests_total", status="499")
            - value(before, "poolserve_requests_total", status="499")
            >= 4
        ),
        timeout=10,
    ), metered.log()
    after = scrape(metered.url)
    assert value(after, "poolserve_requests_total", status="500") == value(
        before, "poolserve_requests_total", status="500"
    )
    log = metered.stderr()[log_start:]
    assert "ERROR" not in log and "Traceback" not in log, log
    assert "client disconnected" in log


def metrics_folder(server: PoolserveProcess) -> Path:
    """The server's multiprocess metrics folder, from an API server's environment (the supervisor sets it
    after it starts, so its own /proc environ lacks it)."""
    api_server = server.child_pid("apiserver")[0]
    environ = Path(f"/proc/{api_server}/environ").read_bytes().split(b"\0")
    (entry,) = [item for item in environ if item.startswith(b"PROMETHEUS_MULTIPROC_DIR=")]
    return Path(entry.split(b"=", 1)[1].decode())


def test_a_garbage_file_in_the_metrics_folder_is_left_out_and_metrics_still_answers(metered: PoolserveProcess) -> None:
    # Once a 500 on every scrape.
    folder = metrics_folder(metered)
    with httpx.Client(base_url=metered.url, timeout=30) as client:
        assert client.post("/v1/embeddings", json={"input": "counted beside the garbage"}).status_code == 200
    assert any(folder.glob("*.db"))
    log_start = len(metered.stderr())
    garbage = [folder / "counter_999999.db", folder / "garbage.db"]
    garbage[0].write_bytes(b"\xff\xff\x00\x00" + os.urandom(5000))
    garbage[1].write_bytes(b"not a metrics file at all")
    try:
        for _ in range(6):  # new connections: both API servers answer some
            samples = scrape(metered.url)
            assert value(samples, "poolserve_metric_files_unreadable") == 2
            assert value(samples, *EMBEDDINGS_200[:1], **EMBEDDINGS_200[1]) > 0  # the readable files are all there
        log = metered.stderr()[log_start:]
        assert "Traceback" not in log and " ERROR " not in log, log
        # One line per file and API server, however many scrapes.
        assert 2 <= log.count("which does not parse") <= 4, log
    finally:
        for path in garbage:
            path.unlink()
    assert value(scrape(metered.url), "poolserve_metric_files_unreadable") == 0


# Dashboard panels that stay empty until something happens that this test does not cause (images, 429s, slow
# clients, a crash loop), or on this server's configuration (no --cache-bytes: no cache to size).
QUIET_PANELS = {"Images / s by endpoint", "Refusals", "Connections timed out", "Engines out of service", "Cache size"}


def test_the_grafana_dashboards_queries_answer_from_a_real_prometheus(
    metered: PoolserveProcess, prometheus: str
) -> None:
    """Every query in deploy/grafana/poolserve.json, Grafana's variables filled in, runs on a Prometheus that
    scrapes the server, and every one not in QUIET_PANELS returns series (tests/deploy/test_grafana.py checks
    names and labels offline; this shows the data behind them)."""
    from tests.deploy.dashboard import load_dashboard, queries

    with metered.client() as client:
        deadline = time.monotonic() + 3  # a few 1 s scrapes, so that rates over 10 s have two samples
        while time.monotonic() < deadline:
            assert client.post("/v1/embeddings", json={"input": ["dashboard", "panel"]}).status_code == 200
            assert client.post("/v1/embeddings", json={"input": 3}).status_code == 400
    empty: set[str] = set()

    def answered() -> bool:
        empty.clear()
        for where, expr in queries(load_dashboard()):
            filled = expr.replace("$__rate_interval", "10s")
            for variable in ("$job", "$instance", "$model"):
                filled = filled.replace(variable, ".*")
            try:
                got = httpx.get(f"{prometheus}/api/v1/query", params={"query": filled}, timeout=5)
            except httpx.HTTPError:
                return False
            assert got.json()["status"] == "success", (where, got.text)
            if not got.json()["data"]["result"]:
                empty.add(where.split("'")[1])
        return empty <= QUIET_PANELS

    assert wait_until(answered, 30, interval=1), f"no data for {sorted(empty - QUIET_PANELS)}"
