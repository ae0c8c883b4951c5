"""A real nginx in front, with an upstream keep-alive pool, as a deployment would have it."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest

from bench.clients import RawClient, prepare_request
from bench.scrape import scrape, value
from bench.server_process import wait_until
from bench.steady_load import SteadyLoad
from tests.utils import LaunchedServer

NGINX_CONF = """
daemon off;
master_process off;
worker_processes 1;
pid {dir}/nginx.pid;
error_log {dir}/error.log warn;
events {{ worker_connections 1024; }}
http {{
    access_log off;
    client_body_temp_path {dir}/body;
    proxy_temp_path {dir}/proxy;
    fastcgi_temp_path {dir}/fastcgi;
    uwsgi_temp_path {dir}/uwsgi;
    scgi_temp_path {dir}/scgi;
    upstream poolserve {{
{servers}
        keepalive 8;
    }}
    server {{
        listen 127.0.0.1:{port};
        location / {{
            proxy_pass http://poolserve;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            # docs/operations.md: every poolserve route computes its answer from the request alone, so a
            # request that met a connection closing or refused may go to another instance, POSTs included.
            proxy_next_upstream error timeout non_idempotent;
        }}
    }}
}}
"""


def find_nginx() -> str | None:
    return shutil.which("nginx") or next((p for p in ("/usr/sbin/nginx",) if os.access(p, os.X_OK)), None)


@pytest.fixture(scope="session")
def nginx_binary() -> str:
    """Debian's nginx, installed here when missing; the test skips, saying why, only if that fails."""
    found = find_nginx()
    if found:
        return found
    apt = shutil.which("apt-get")
    if apt is None or os.geteuid() != 0:
        pytest.skip("nginx is not installed and cannot be installed here (needs apt-get as root)")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    install = [apt, "install", "-y", "--no-install-recommends", "nginx"]
    done = subprocess.run(install, capture_output=True, text=True, env=env, timeout=300, check=False)
    if done.returncode != 0:
        subprocess.run([apt, "update"], capture_output=True, env=env, timeout=300, check=False)
        done = subprocess.run(install, capture_output=True, text=True, env=env, timeout=300, check=False)
    found = find_nginx()
    if found is None:
        pytest.skip(f"installing nginx failed: {done.stderr.strip()[-500:]}")
    return found


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def nginx_in_front(binary: str, upstream_ports: list[int], folder: Path) -> Iterator[str]:
    """nginx on a free port, proxying to `upstream_ports`; an upstream that failed is tried again after 1 s."""
    port = free_port()
    conf = folder / "nginx.conf"
    servers = "\n".join(
        f"        server 127.0.0.1:{upstream} max_fails=1 fail_timeout=1s;" for upstream in upstream_ports
    )
    conf.write_text(NGINX_CONF.format(dir=folder, servers=servers, port=port))
    proc = subprocess.Popen(
        [binary, "-c", str(conf), "-p", str(folder)], stderr=subprocess.PIPE, start_new_session=True
    )
    try:

        def is_listening() -> bool:
            with socket.socket() as sock:
                return sock.connect_ex(("127.0.0.1", port)) == 0

        assert wait_until(is_listening, 10), (
            (folder / "error.log").read_text() if (folder / "error.log").exists() else ""
        )
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
        if proc.stderr is not None:
            proc.stderr.close()


def through_proxy(url: str, clients: int = 32, requests: int = 10) -> tuple[Counter[str], Counter[int]]:
    """`clients` keep-alive clients of the proxy, `requests` embedding requests each."""
    request = prepare_request(
        "POST", "/v1/embeddings", msgspec.json.encode({"input": "routed through a proxy"}), url.split("://")[1]
    )

    async def run() -> tuple[Counter[str], Counter[int]]:
        servers: Counter[str] = Counter()
        statuses: Counter[int] = Counter()

        async def client() -> None:
            connection = await RawClient(url).connect()
            for _ in range(requests):
                reply = await connection.send(request)
                statuses[reply.status] += 1
                servers[reply.server] += 1
            connection.close()

        await asyncio.gather(*(client() for _ in range(clients)))
        return servers, statuses

    return asyncio.run(run())


def test_requests_through_nginx_keepalive_spread_over_both_servers_before_and_after_sighup(
    nginx_binary: str, tmp_path: Path
) -> None:
    server = LaunchedServer("--api-server-count", "2")
    try:
        server.wait_ready(timeout=120)
        with nginx_in_front(nginx_binary, [server.port], tmp_path) as proxy:
            servers, statuses = through_proxy(proxy)
            assert statuses == {200: 320}, statuses
            assert min(servers["0"], servers["1"]) >= 320 * 0.3, servers

            server.proc.send_signal(signal.SIGHUP)
            replaced = re.compile(r"api-1: pid \d+ is ready; pid \d+ drains and stops")
            assert wait_until(lambda: replaced.search(server.stderr()), 60), server.log()
            assert wait_until(lambda: len(server.child_pid("apiserver")) == 2, 60), server.log()

            servers, statuses = through_proxy(proxy)
            assert statuses == {200: 320}, statuses
            assert min(servers["0"], servers["1"]) >= 320 * 0.3, servers
    finally:
        server.stop()


def requests_answered(server: LaunchedServer) -> float:
    """The embedding requests one poolserve instance answered, from its own /metrics."""
    return value(scrape(server.url), "poolserve_requests_total", endpoint="/v1/embeddings", status="200")


def test_two_instances_behind_nginx_one_stopped_and_started_again_no_request_fails(
    nginx_binary: str, tmp_path: Path
) -> None:
    """The replica case (docs/scaling.md): SIGTERM drains an instance while nginx sends its new requests to
    the other, and once it is started again nginx sends it work again; the client never sees a failure."""
    first = LaunchedServer("--api-server-count", "1")
    second = LaunchedServer("--api-server-count", "1")
    try:
        first.wait_ready(timeout=120)
        second.wait_ready(timeout=120)
        port = first.port
        with nginx_in_front(nginx_binary, [first.port, second.port], tmp_path) as proxy:
            with SteadyLoad(proxy, clients=8) as load:
                load.wait_for(60)
                assert requests_answered(first) > 0 and requests_answered(second) > 0
                first.proc.send_signal(signal.SIGTERM)
                assert first.wait_exit(60) == 0, first.log()
                load.wait_for(sum(load.statuses.values()) + 60)
                first = LaunchedServer("--api-server-count", "1", "--port", str(port))
                first.wait_ready(timeout=120)
                assert wait_until(lambda: requests_answered(first) >= 20, 30), "nginx sent the restarted one nothing"
            assert load.failures == [], load.failures
            assert set(load.statuses) == {200}, load.statuses
    finally:
        first.stop()
        second.stop()
