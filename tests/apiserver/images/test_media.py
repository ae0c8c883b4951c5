from __future__ import annotations

import asyncio
import base64
import io
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest
from PIL import Image

from apiserver.errors import ApiError
from apiserver.images.fetch_guard import BlockedDestination, FetchPolicy, GuardedBackend, GuardedTransport, IpAddress
from apiserver.images.media import MediaFetcher

MAX_BYTES = 4096
TIMEOUT = 0.5


def png_bytes() -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (16, 16), (200, 10, 10)).save(out, format="PNG")
    return out.getvalue()


GOOD = png_bytes()


class ImageServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), Handler)
        # Set on teardown, so that handlers still sleeping or trickling end at once.
        self.closing = threading.Event()
        # Host headers of the requests that reached this server, in order.
        self.hosts: list[str] = []

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: ImageServer

    def log_message(self, format: str, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        self.server.hosts.append(self.headers.get("host", ""))
        path = self.path
        if path == "/good.png":
            self.reply(200, GOOD)
        elif path == "/missing":
            self.reply(404, b"not here")
        elif path == "/slow":
            if not self.server.closing.wait(TIMEOUT + 5):
                self.reply(200, GOOD)
        elif path == "/trickle":
            # Headers at once, then a byte now and then: only a deadline on the whole fetch ends it.
            self.send_response(200)
            self.send_header("Content-Length", str(len(GOOD)))
            self.end_headers()
            self.write_slowly(GOOD, pause=0.1)
        elif path == "/declares-too-much":
            self.send_response(200)
            self.send_header("Content-Length", str(10 * MAX_BYTES))
            self.end_headers()
            # Slow enough that a client reading this body would take minutes to see it is too big.
            self.write_slowly(b"x" * 10 * MAX_BYTES, pause=0.5)
        elif path == "/chunked-forever":
            self.send_response(200)
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            self.write_chunks()
        elif path.startswith("/redirect-to/"):
            # /redirect-to/<host>: a redirect to the same path on another host name (or address).
            self.send_response(302)
            self.send_header("Location", f"http://{path.split('/')[2]}:{self.server.server_address[1]}/good.png")
            self.send_header("Content-Length", "0")
            self.end_headers()
        elif path.startswith("/redirect/"):
            hops = int(path.rsplit("/", 1)[1])
            self.send_response(302)
            self.send_header("Location", f"/redirect/{hops - 1}" if hops > 1 else "/good.png")
            self.send_header("Content-Length", "0")
            self.end_headers()
        else:
            self.reply(500, b"no such test route")

    def reply(self, status: int, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def write_slowly(self, body: bytes, pause: float) -> None:
        try:
            for i in range(len(body)):
                if self.server.closing.wait(pause):
                    return
                self.wfile.write(body[i : i + 1])
                self.wfile.flush()
        except OSError:  # the client hung up, as it should
            pass

    def write_chunks(self) -> None:
        chunk = b"y" * 1024
        try:
            for _ in range(10 * MAX_BYTES // len(chunk)):
                if self.server.closing.is_set():
                    return
                self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                self.wfile.flush()
                time.sleep(0.05)
            self.wfile.write(b"0\r\n\r\n")
        except OSError:
            pass
        self.close_connection = True


@pytest.fixture(scope="module")
def server() -> Iterator[ImageServer]:
    httpd = ImageServer()
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield httpd
    finally:
        httpd.closing.set()
        httpd.shutdown()
        httpd.server_close()
        thread.join(5)


# The image server here is on loopback, which only --allow-private-media-urls reaches (tests/apiserver/
# test_fetch_guard.py covers the default).
LOOPBACK_ALLOWED = FetchPolicy(allow_private=True)


def fetch(
    source: str,
    *,
    max_bytes: int = MAX_BYTES,
    timeout: float = TIMEOUT,
    allowed_local_path: str = "",
    policy: FetchPolicy = LOOPBACK_ALLOWED,
) -> bytes:
    async def main() -> bytes:
        fetcher = MediaFetcher(
            max_bytes=max_bytes, timeout=timeout, allowed_local_path=allowed_local_path, policy=policy
        )
        try:
            return await fetcher.fetch(source, param="input[1].image")
        finally:
            await fetcher.aclose()

    return asyncio.run(main())


def refused(source: str, status: int = 400, **kwargs: object) -> ApiError:
    with pytest.raises(ApiError) as caught:
        fetch(source, **kwargs)  # type: ignore[arg-type]
    assert caught.value.status == status, caught.value.message
    assert caught.value.param == "input[1].image"
    assert "input[1].image" in caught.value.message
    return caught.value


# http(s) -----------------------------------------------------------------------------------------


def test_an_image_url_gives_its_bytes(server: ImageServer) -> None:
    assert fetch(f"{server.url}/good.png") == GOOD


def test_one_client_serves_many_fetches(server: ImageServer) -> None:
    async def main() -> list[bytes]:
        fetcher = MediaFetcher(max_bytes=MAX_BYTES, timeout=5, allowed_local_path="", policy=LOOPBACK_ALLOWED)
        try:
            first = await fetcher.fetch(f"{server.url}/good.png", param="a")
            client = fetcher._client
            rest = await asyncio.gather(*(fetcher.fetch(f"{server.url}/good.png", param="b") for _ in range(5)))
            assert fetcher._client is client
            return [first, *rest]
        finally:
            await fetcher.aclose()

    assert asyncio.run(main()) == [GOOD] * 6


def test_an_error_status_is_a_400_naming_it(server: ImageServer) -> None:
    assert "HTTP 404" in refused(f"{server.url}/missing").message


@pytest.mark.parametrize("route", ["/slow", "/trickle"])
def test_a_slow_server_times_out_within_the_deadline(server: ImageServer, route: str) -> None:
    started = time.monotonic()
    error = refused(f"{server.url}{route}")
    assert time.monotonic() - started < TIMEOUT + 1
    assert "timed out" in error.message


def test_a_declared_length_over_the_cap_is_refused_without_reading_the_body(server: ImageServer) -> None:
    started = time.monotonic()
    error = refused(f"{server.url}/declares-too-much", status=413, timeout=30)
    assert time.monotonic() - started < 1
    assert str(10 * MAX_BYTES) in error.message


def test_a_stream_past_the_cap_is_refused_as_it_passes(server: ImageServer) -> None:
    started = time.monotonic()
    refused(f"{server.url}/chunked-forever", status=413, timeout=30)
    # The server would take 2 s to send all 40 chunks; the cap is passed after 5.
    assert time.monotonic() - started < 1


def test_three_redirects_are_followed(server: ImageServer) -> None:
    assert fetch(f"{server.url}/redirect/3") == GOOD


def test_a_fourth_redirect_is_refused(server: ImageServer) -> None:
    assert "redirects more than 3 times" in refused(f"{server.url}/redirect/4").message


def test_a_refused_connection_is_a_400(server: ImageServer) -> None:
    # A port that was just free: nothing listens there.
    probe = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    port = probe.server_address[1]
    probe.server_close()
    assert "cannot fetch" in refused(f"http://127.0.0.1:{port}/good.png").message


# where URLs may lead (SSRF) ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:{port}/good.png",
        "http://localhost:{port}/good.png",
        "http://[::1]:{port}/good.png",
        "http://2130706433:{port}/good.png",  # 127.0.0.1 as one decimal number
        "http://0.0.0.0:{port}/good.png",
        "http://169.254.169.254/latest/meta-data/",  # the cloud metadata service
        "http://[fd00:ec2::254]/latest/meta-data/",  # its IPv6 address on AWS
        "http://10.0.0.1/cat.png",
        "http://192.168.1.1/cat.png",
        "http://[::ffff:127.0.0.1]:{port}/good.png",
    ],
)
def test_non_public_addresses_are_refused_by_default_without_a_connection(server: ImageServer, url: str) -> None:
    seen = len(server.hosts)
    error = refused(url.format(port=server.server_address[1]), policy=FetchPolicy())
    assert error.code == "media_url_not_allowed"
    assert "not a public address" in error.message
    assert len(server.hosts) == seen


class LoopbackOneOnly(FetchPolicy):
    """Allows 127.0.0.1 and nothing else: a stand-in for "public" that a test can serve from."""

    def allows_address(self, address: IpAddress) -> bool:
        return str(address) == "127.0.0.1"


def test_every_redirect_is_checked_where_it_connects(server: ImageServer) -> None:
    # what is checked is the policy, not time: the fetch's own half second ran out once in a clean-clone run of the
    # suite on a loaded 2-core host (`fetching .../redirect-to/127.0.0.2 timed out after 0.5 s`)
    assert fetch(f"{server.url}/redirect/2", policy=LoopbackOneOnly(), timeout=10.0) == GOOD
    error = refused(f"{server.url}/redirect-to/127.0.0.2", policy=LoopbackOneOnly(), timeout=10.0)
    assert error.code == "media_url_not_allowed"


def test_allowed_media_domains_bind_every_redirect(server: ImageServer) -> None:
    policy = FetchPolicy(allowed_domains=["127.0.0.1"], allow_private=True)
    assert fetch(f"{server.url}/redirect/1", policy=policy) == GOOD
    error = refused(f"{server.url}/redirect-to/localhost", policy=policy)
    assert "'localhost' is not one this server fetches images from" in error.message
    assert "is not one" in refused(f"http://localhost:{server.server_address[1]}/good.png", policy=policy).message


class FixedResolver(GuardedBackend):
    """Resolves every name to fixed addresses, as a DNS server under an attacker's control could."""

    def __init__(self, policy: FetchPolicy, addresses: list[str]):
        super().__init__(policy)
        self.addresses = addresses

    async def resolve(self, host: str, port: int) -> list[str]:
        return self.addresses


def get_through(backend: GuardedBackend, url: str) -> httpx.Response:
    async def main() -> httpx.Response:
        transport = GuardedTransport(backend.policy, backend=backend)
        async with httpx.AsyncClient(transport=transport, timeout=5) as client:
            return await client.get(url)

    return asyncio.run(main())


def test_the_connection_goes_to_the_address_that_was_checked_under_the_url_host_name(server: ImageServer) -> None:
    port = server.server_address[1]
    response = get_through(FixedResolver(LoopbackOneOnly(), ["127.0.0.1"]), f"http://images.test:{port}/good.png")
    assert response.content == GOOD
    assert server.hosts[-1] == f"images.test:{port}"


def test_a_name_with_any_non_public_address_is_refused(server: ImageServer) -> None:
    port = server.server_address[1]
    seen = len(server.hosts)
    for addresses in (["127.0.0.2"], ["127.0.0.1", "127.0.0.2"], ["127.0.0.2", "127.0.0.1"]):
        with pytest.raises(BlockedDestination):
            get_through(FixedResolver(LoopbackOneOnly(), addresses), f"http://images.test:{port}/good.png")
    assert len(server.hosts) == seen


# data: URLs --------------------------------------------------------------------------------------


def test_a_base64_data_url_gives_its_bytes() -> None:
    assert fetch("data:image/png;base64," + base64.b64encode(GOOD).decode()) == GOOD


def test_wrapped_or_unpadded_base64_is_accepted() -> None:
    assert fetch("data:image/png;base64," + base64.encodebytes(GOOD).decode()) == GOOD
    assert fetch("DATA:image/png;base64," + base64.b64encode(GOOD[:-1]).decode().rstrip("=")) == GOOD[:-1]


@pytest.mark.parametrize(
    ("source", "says"),
    [
        ("data:image/png;base64,!!!not base64!!!", "invalid"),
        ("data:image/png;base64,abcde", "invalid"),
        ("data:image/png,raw-bytes", "not base64"),
        ("data:image/png;base64", "not base64"),
    ],
)
def test_bad_data_urls_are_400s(source: str, says: str) -> None:
    assert says in refused(source).message


def test_a_data_url_over_the_cap_is_a_413() -> None:
    refused("data:image/png;base64," + base64.b64encode(b"\0" * (MAX_BYTES + 1)).decode(), status=413)
    assert fetch("data:image/png;base64," + base64.b64encode(b"\0" * MAX_BYTES).decode()) == b"\0" * MAX_BYTES


# other sources and local files -------------------------------------------------------------------


@pytest.mark.parametrize("source", ["ftp://example.com/a.png", "cat.png", "images/cat.png", "", "C:\\cat.png"])
def test_anything_else_is_a_400_listing_what_is_accepted(source: str) -> None:
    assert "data: URL" in refused(source).message


@pytest.fixture
def media_folder(tmp_path: Path) -> Path:
    folder = tmp_path / "media"
    folder.mkdir()
    (folder / "cat.png").write_bytes(GOOD)
    (folder / "big.bin").write_bytes(b"\0" * (MAX_BYTES + 1))
    (tmp_path / "secret.png").write_bytes(GOOD)
    (folder / "link-out.png").symlink_to(tmp_path / "secret.png")
    return folder


def test_local_files_are_refused_by_default(media_folder: Path) -> None:
    assert "not allowed" in refused(str(media_folder / "cat.png")).message
    assert "not allowed" in refused((media_folder / "cat.png").as_uri()).message


def test_a_file_inside_the_allowed_folder_is_read(media_folder: Path) -> None:
    assert fetch(str(media_folder / "cat.png"), allowed_local_path=str(media_folder)) == GOOD
    assert fetch((media_folder / "cat.png").as_uri(), allowed_local_path=str(media_folder)) == GOOD


@pytest.mark.parametrize(
    "name", ["../secret.png", "link-out.png", "sub/../../secret.png"], ids=["dotdot", "symlink", "dotdot-deeper"]
)
def test_paths_leading_out_of_the_folder_are_refused(media_folder: Path, name: str) -> None:
    source = f"{media_folder}/{name}"
    assert "outside the allowed folder" in refused(source, allowed_local_path=str(media_folder)).message
    assert "outside the allowed folder" in refused(f"file://{source}", allowed_local_path=str(media_folder)).message


def test_a_local_file_over_the_cap_is_a_413(media_folder: Path) -> None:
    refused(str(media_folder / "big.bin"), status=413, allowed_local_path=str(media_folder))


def test_a_missing_file_or_a_folder_is_a_400(media_folder: Path) -> None:
    assert "cannot read" in refused(str(media_folder / "nope.png"), allowed_local_path=str(media_folder)).message
    assert "not a regular file" in refused(str(media_folder), allowed_local_path=str(media_folder)).message
