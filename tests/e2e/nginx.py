"""A real nginx in front of poolserve instances, configured as docs/operations.md recommends: the tests behind
a proxy share it (tests/e2e/test_behind_nginx.py, test_host_loss.py)."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

from bench.harness.server_process import free_port, wait_until

NGINX_CONF = """
daemon off;
master_process off;
worker_processes 1;
pid {dir}/nginx.pid;
error_log {dir}/error.log warn;
events {{ worker_connections 1024; }}
http {{
    # Which upstream(s) each request went to, in order: a retried request lists two.
    log_format upstreams '$upstream_addr|$upstream_status|$status';
    access_log {dir}/access.log upstreams;
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
        listen {listen};
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


def nginx_or_skip() -> str:
    """Debian's nginx (`make test-tools` installs it, as root); the calling test skips, saying why, without it."""
    found = find_nginx()
    if found is None:
        pytest.skip("nginx is not installed: `make test-tools` installs Debian's nginx package (as root)")
    return found


@dataclass
class Proxy:
    """A running nginx: its URL, and the Unix socket it listens on when it runs in another network namespace."""

    url: str
    folder: Path
    uds: str | None = None

    def upstream_log(self) -> list[tuple[list[str], str]]:
        """(upstreams tried, in order; nginx's status) of every request answered so far."""
        path = self.folder / "access.log"
        rows = []
        for line in path.read_text().splitlines() if path.exists() else []:
            tried, _, status = line.split("|")
            rows.append(([address.strip() for address in tried.split(",")], status))
        return rows


@contextlib.contextmanager
def nginx_in_front(binary: str, upstreams: Sequence[str], folder: Path, netns: str | None = None) -> Iterator[Proxy]:
    """nginx proxying to `upstreams` (host:port); an upstream that failed is tried again after 1 s.

    On a free loopback port, or, run inside network namespace `netns`, on a Unix socket in `folder`
    (a path crosses namespaces where an address would not)."""
    uds = str(folder / "nginx.sock") if netns else None
    port = 0 if netns else free_port()
    conf = folder / "nginx.conf"
    servers = "\n".join(f"        server {upstream} max_fails=1 fail_timeout=1s;" for upstream in upstreams)
    listen = f"unix:{uds}" if uds else f"127.0.0.1:{port}"
    conf.write_text(NGINX_CONF.format(dir=folder, servers=servers, listen=listen))
    prefix = ["ip", "netns", "exec", netns] if netns else []
    proc = subprocess.Popen(
        [*prefix, binary, "-c", str(conf), "-p", str(folder)], stderr=subprocess.PIPE, start_new_session=True
    )
    try:

        def is_listening() -> bool:
            if uds:
                with socket.socket(socket.AF_UNIX) as sock:
                    return sock.connect_ex(uds) == 0
            with socket.socket() as sock:
                return sock.connect_ex(("127.0.0.1", port)) == 0

        assert wait_until(is_listening, 10), (
            (folder / "error.log").read_text() if (folder / "error.log").exists() else ""
        )
        yield Proxy(url="http://nginx" if uds else f"http://127.0.0.1:{port}", folder=folder, uds=uds)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
        if proc.stderr is not None:
            proc.stderr.close()
