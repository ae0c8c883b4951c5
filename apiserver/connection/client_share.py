"""The connections each client address holds on one API server, and its share of them (--max-connections-per-client).

Without a share, one client could hold every slot: with --max-connections-per-server 32, 64 idle
connections from one address that sent a request every 50 s shut every newcomer out (60 of 60 got
503 over 90 s). nginx's `limit_conn` with `$binary_remote_addr` is the model: counted by the peer
address at accept, before a byte is read, and a connection past the share is answered 503 and closed.

A trusted proxy (uvicorn's --forwarded-allow-ips, FORWARDED_ALLOW_IPS in the environment) carries
many clients over its connections, and the address it forwards comes with each request, after the
connection is already counted: its connections are not counted against any share. Limit clients
behind a proxy at the proxy (nginx's `limit_conn`).
"""

from __future__ import annotations

import logging
import socket
from collections import Counter
from collections.abc import Callable

from apiserver.connection.refusal import Refuser
from apiserver.errors import error_bytes
from apiserver.metrics import CONNECTIONS_REFUSED

logger = logging.getLogger("poolserve.api")


class ClientShare:
    """Open connections by peer address; `limit` 0 counts nothing and refuses nothing."""

    def __init__(self, limit: int, is_trusted: Callable[[str], bool] = lambda address: False):
        self.limit = limit
        self.is_trusted = is_trusted
        self._open: Counter[str] = Counter()

    def admit(self, address: str) -> bool:
        """Count a new connection from `address`; False (and not counted) when that address holds its share."""
        if not self.limit or self.is_trusted(address):
            return True
        if self._open[address] >= self.limit:
            return False
        self._open[address] += 1
        return True

    def release(self, address: str) -> None:
        """A connection `admit` counted has closed."""
        if not self.limit or self.is_trusted(address):
            return
        self._open[address] -= 1
        if self._open[address] <= 0:
            del self._open[address]

    def holding(self, address: str) -> int:
        return self._open[address]


class ShareRefuser(Refuser):
    """Answers, counts (reason=client_share) and logs the connections refused because their client holds its share."""

    def __init__(self, server_label: str, limit: int):
        super().__init__(server_label, limit)
        self.answer = error_bytes(
            503,
            f"This client holds its share of {limit} connections to this API server (--max-connections-per-client); "
            "close one or retry shortly.",
            "too_many_connections",
        )
        self._counted = CONNECTIONS_REFUSED.labels(server=server_label, reason="client_share")

    def _log(self, count: int) -> None:
        logger.warning(
            "refused %d new connection(s) with 503: their client holds its --max-connections-per-client share of %d",
            count,
            self.max_connections,
        )


def peer_host(conn: socket.socket) -> str:
    """The client's address, without its port."""
    try:
        return str(conn.getpeername()[0])
    except (OSError, IndexError, TypeError):
        return ""
