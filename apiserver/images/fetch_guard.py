"""Where image URLs may lead (SSRF protection): allowed host names, public addresses only, checked per connection.

A URL's host name is checked against --allowed-media-domains on every request httpx sends, redirects
included. Its addresses are checked where the TCP connection is made: the host is resolved once, every
address must be public (unless --allow-private-media-urls), and the connection goes to an address that
was checked. A DNS answer that changes between a check and the connection (rebinding) therefore cannot
lead anywhere unchecked; TLS still verifies the certificate against the host name, not the address.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
import typing
from collections.abc import Iterable, Sequence

import httpcore
import httpx

IpAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

# IPv6 ranges whose addresses carry an IPv4 address in their low 32 bits: NAT64's well-known prefix
# (RFC 6052) and the deprecated IPv4-compatible form (`::127.0.0.1`, RFC 4291), which Python's
# ipaddress counts as global whatever it embeds.
NAT64 = ipaddress.IPv6Network("64:ff9b::/96")
IPV4_COMPATIBLE = ipaddress.IPv6Network("::/96")
# Refused whole rather than unwrapped. Local-use NAT64 (RFC 8215): the operator picks the prefix length
# (/48 to /96), so where the IPv4 address sits cannot be known, and IANA lists the range as not globally
# reachable; Python 3.11 counts it as global. Teredo (RFC 4380): the client's address is obfuscated and
# a Teredo relay reaches whatever it names; Python already counts the range as not global, said here so
# that the refusal does not hang on one Python version's tables.
NEVER_PUBLIC = (ipaddress.IPv6Network("64:ff9b:1::/48"), ipaddress.IPv6Network("2001::/32"))

# httpx's defaults.
MAX_CONNECTIONS = 100
MAX_KEEPALIVE_CONNECTIONS = 20


class BlockedDestination(Exception):
    """A URL, or a redirect, that leads where this server does not fetch from; the message says why."""


def embedded_ipv4(address: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 address stands for (mapped, compatible, 6to4, NAT64), whose reach is what counts."""
    if address.ipv4_mapped is not None:
        return address.ipv4_mapped
    if address.sixtofour is not None:
        return address.sixtofour
    if address in NAT64 or address in IPV4_COMPATIBLE:
        return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    return None


def is_public(address: IpAddress) -> bool:
    """Globally reachable unicast: not loopback, private, link-local (169.254.169.254, the cloud metadata
    service), shared (100.64/10), reserved, documentation, multicast or unspecified. An IPv6 address that
    embeds an IPv4 address is public only if that address is too."""
    if isinstance(address, ipaddress.IPv6Address):
        if any(address in network for network in NEVER_PUBLIC):
            return False
        inner = embedded_ipv4(address)
        if inner is not None and not is_public(inner):
            return False
    return address.is_global and not address.is_multicast


class FetchPolicy:
    def __init__(self, *, allowed_domains: Sequence[str] = (), allow_private: bool = False):
        self.allowed_domains = frozenset(normalize_host(domain) for domain in allowed_domains)
        self.allow_private = allow_private

    def check_host(self, host: str) -> None:
        if self.allowed_domains and normalize_host(host) not in self.allowed_domains:
            raise BlockedDestination(f"the host {host!r} is not one this server fetches images from")

    def check_addresses(self, host: str, addresses: Iterable[str]) -> None:
        """Every address must pass: a name that resolves to a public and a private address is refused."""
        for text in addresses:
            if not self.allows_address(ipaddress.ip_address(text.partition("%")[0])):
                # The address is not quoted: the server would otherwise tell clients what its internal names resolve to.
                raise BlockedDestination(f"{host!r} is not a public address; this server fetches only from public ones")

    def allows_address(self, address: IpAddress) -> bool:
        return self.allow_private or is_public(address)


def normalize_host(host: str) -> str:
    return host.rstrip(".").lower()


class GuardedBackend(httpcore.AsyncNetworkBackend):
    """httpcore's network backend with the address check between resolving a host and connecting to it."""

    def __init__(self, policy: FetchPolicy):
        self.policy = policy
        # The API servers run asyncio (uvloop), which anyio drives.
        self.backend = httpcore.AnyIOBackend()

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: typing.Iterable[httpcore.SOCKET_OPTION] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        addresses = await self.resolve(host, port)
        self.policy.check_addresses(host, addresses)
        error: Exception = BlockedDestination(f"{host!r} has no address")
        for address in addresses:
            try:
                return await self.backend.connect_tcp(
                    address, port, timeout=timeout, local_address=local_address, socket_options=socket_options
                )
            except (httpcore.ConnectError, httpcore.ConnectTimeout) as exc:
                error = exc
        raise error

    async def connect_unix_socket(
        self,
        path: str,
        timeout: float | None = None,
        socket_options: typing.Iterable[httpcore.SOCKET_OPTION] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        raise BlockedDestination("unix sockets are not fetched from")

    async def sleep(self, seconds: float) -> None:
        await self.backend.sleep(seconds)

    async def resolve(self, host: str, port: int) -> list[str]:
        """The host's addresses, distinct, in the resolver's order of preference."""
        try:
            infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except socket.gaierror as exc:
            raise httpcore.ConnectError(f"cannot resolve {host!r}: {exc.strerror}") from exc
        return list(dict.fromkeys(str(info[4][0]) for info in infos))


class GuardedTransport(httpx.AsyncHTTPTransport):
    """httpx's transport, its connection pool on the guarded backend, checking each request's host (every
    redirect reaches the transport as a request of its own)."""

    def __init__(self, policy: FetchPolicy, backend: GuardedBackend | None = None):
        # No proxies from the environment: through a proxy, the addresses that count are the proxy's to resolve.
        super().__init__(trust_env=False)
        self.policy = policy
        # httpx's transport takes no network backend, so its pool is replaced by one that has ours.
        self._pool = httpcore.AsyncConnectionPool(
            # SSL_CERT_FILE and SSL_CERT_DIR still count, as they did for httpx's own transport.
            ssl_context=httpx.create_ssl_context(),
            max_connections=MAX_CONNECTIONS,
            max_keepalive_connections=MAX_KEEPALIVE_CONNECTIONS,
            network_backend=backend or GuardedBackend(policy),
        )

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        self.policy.check_host(request.url.host)
        return await super().handle_async_request(request)
