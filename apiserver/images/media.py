"""Fetches the bytes of an image a request names: a data: URL, an http(s) URL, or an allowed local file."""

from __future__ import annotations

import asyncio
import base64
import binascii
import os
import stat
import urllib.parse
from pathlib import Path

import httpx

from apiserver.errors import ApiError
from apiserver.images.fetch_guard import BlockedDestination, FetchPolicy, GuardedTransport

MAX_REDIRECTS = 3
# Error messages quote the URL a client sent, but not all of a long one.
URL_SHOWN = 120


class MediaFetcher:
    """One per API-server process and event loop; its HTTP client is created on first use and shared."""

    def __init__(self, *, max_bytes: int, timeout: float, allowed_local_path: str, policy: FetchPolicy | None = None):
        self.max_bytes = max_bytes
        self.timeout = timeout
        self.policy = policy or FetchPolicy()
        # Resolved once, so that a symlinked folder compares equal to the paths resolved inside it.
        self.allowed_local_path = Path(allowed_local_path).resolve() if allowed_local_path else None
        self._client: httpx.AsyncClient | None = None

    async def fetch(self, source: str, *, param: str) -> bytes:
        """The bytes `source` names, at most `max_bytes`; anything wrong is an ApiError naming `param`."""
        scheme = source.partition(":")[0].lower() if ":" in source else ""
        if scheme == "data":
            return self.decode_data_url(source, param)
        if scheme in ("http", "https"):
            return await self.download(source, param)
        if scheme == "file" or source.startswith("/"):
            return await self.read_local(source, param)
        forms = ["a data: URL (data:image/png;base64,...)", "an http(s) URL"]
        if self.allowed_local_path:
            forms += ["a file:// URL", "an absolute path"]
        accepted = ", ".join(forms[:-1]) + " or " + forms[-1]
        raise ApiError(400, f"{param} must be {accepted}; got {shorten(source)!r}.", param=param)

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    def too_big(self, param: str, size: int | None = None) -> ApiError:
        said = f" ({size} bytes)" if size is not None else ""
        return ApiError(413, f"{param} is larger{said} than the limit of {self.max_bytes} bytes.", param=param)

    def decode_data_url(self, source: str, param: str) -> bytes:
        header, comma, payload = source[len("data:") :].partition(",")
        if not comma or not header.lower().endswith(";base64"):
            raise ApiError(400, f"{param} is a data: URL that is not base64 (data:image/png;base64,...).", param=param)
        # Clients wrap base64 at 76 columns (MIME) or drop the padding; neither changes the bytes.
        payload = "".join(payload.split())
        payload += "=" * (-len(payload) % 4)
        if len(payload) // 4 * 3 > self.max_bytes + 2:
            # Refused by its length alone: no need to decode a payload that is too big anyway.
            raise self.too_big(param)
        try:
            data = base64.b64decode(payload, validate=True)
        except (binascii.Error, ValueError) as exc:
            raise ApiError(400, f"{param} is a data: URL whose base64 is invalid: {exc}.", param=param) from exc
        if len(data) > self.max_bytes:
            raise self.too_big(param, len(data))
        return data

    def http_client(self) -> httpx.AsyncClient:
        if self._client is None:
            self._client = httpx.AsyncClient(
                follow_redirects=True,
                max_redirects=MAX_REDIRECTS,
                timeout=self.timeout,
                # Images are compressed already; asking for them as they are spares us inflating a
                # transfer encoding whose output size the server, not the cap, would decide.
                headers={"accept-encoding": "identity", "user-agent": "poolserve"},
                transport=GuardedTransport(self.policy),
                trust_env=False,
            )
        return self._client

    async def download(self, url: str, param: str) -> bytes:
        shown = shorten(url)
        try:
            # One deadline for everything: connecting, redirects, and a server that trickles bytes.
            async with asyncio.timeout(self.timeout):
                return await self.read_response(url, param)
        except (TimeoutError, httpx.TimeoutException) as exc:
            raise ApiError(400, f"{param}: fetching {shown} timed out after {self.timeout:g} s.", param=param) from exc
        except httpx.TooManyRedirects as exc:
            raise ApiError(400, f"{param}: {shown} redirects more than {MAX_REDIRECTS} times.", param=param) from exc
        except BlockedDestination as exc:
            raise ApiError(
                400, f"{param}: {shown} is not fetched: {exc}.", param=param, code="media_url_not_allowed"
            ) from exc
        except (httpx.HTTPError, httpx.InvalidURL) as exc:
            raise ApiError(400, f"{param}: cannot fetch {shown}: {exc}.", param=param) from exc

    async def read_response(self, url: str, param: str) -> bytes:
        async with self.http_client().stream("GET", url) as response:
            if not response.is_success:
                raise ApiError(400, f"{param}: {shorten(url)} answered HTTP {response.status_code}.", param=param)
            declared = response.headers.get("content-length", "")
            if declared.isdigit() and int(declared) > self.max_bytes:
                # Leaving the block closes the connection without reading the body.
                raise self.too_big(param, int(declared))
            body = bytearray()
            async for chunk in response.aiter_bytes():
                body += chunk
                if len(body) > self.max_bytes:
                    raise self.too_big(param)
            return bytes(body)

    async def read_local(self, source: str, param: str) -> bytes:
        if self.allowed_local_path is None:
            raise ApiError(
                400,
                f"{param} names a local file, and local files are not allowed "
                "(the server was started without --allowed-local-media-path).",
                param=param,
            )
        text = source
        if source.partition(":")[0].lower() == "file":
            parts = urllib.parse.urlsplit(source)
            if parts.netloc not in ("", "localhost"):
                raise ApiError(400, f"{param} is a file:// URL on another host ({parts.netloc}).", param=param)
            text = urllib.parse.unquote(parts.path)
        path = Path(text)
        if not path.is_absolute():
            raise ApiError(400, f"{param} must name a local file by its absolute path.", param=param)
        try:
            # Symlinks and `..` are resolved before the check, so neither leads out of the folder.
            resolved = path.resolve()
        except (OSError, RuntimeError, ValueError) as exc:  # a symlink loop, a NUL byte
            raise ApiError(400, f"{param} is not a usable path: {exc}.", param=param) from exc
        if not resolved.is_relative_to(self.allowed_local_path):
            raise ApiError(
                400,
                f"{param} names a file outside the allowed folder {self.allowed_local_path}.",
                param=param,
            )
        return await asyncio.to_thread(self.read_file, resolved, param)

    def read_file(self, path: Path, param: str) -> bytes:
        try:
            # O_NOFOLLOW: a symlink swapped in since resolve() is refused, not followed. O_NONBLOCK: a
            # FIFO opens at once (and is refused below) instead of waiting for a writer.
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError as exc:
            raise ApiError(400, f"{param}: cannot read {path}: {exc.strerror}.", param=param) from exc
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                raise ApiError(400, f"{param}: {path} is not a regular file.", param=param)
            if info.st_size > self.max_bytes:
                raise self.too_big(param, info.st_size)
            f = os.fdopen(fd, "rb")
        except BaseException:
            os.close(fd)
            raise
        with f:
            # One byte past the cap, so that a file that grew since fstat is caught too.
            data = f.read(self.max_bytes + 1)
        if len(data) > self.max_bytes:
            raise self.too_big(param)
        return data


def shorten(text: str) -> str:
    return text if len(text) <= URL_SHOWN else text[: URL_SHOWN - 3] + "..."
