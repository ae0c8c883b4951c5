"""Connections an API server accepts only to refuse them: 503 when every server holds --max-connections-per-server.

Left in the listen queue, a connection no server can take waits with no answer until the queue
overflows and the kernel drops new ones: at the file-descriptor limit, half of new connections
failed for 40 s with nothing logged. So once every API server is full and a connection has waited
fair accept's handoff time, a full server accepts it and answers 503 with `Retry-After` and
`Connection: close`, counts it (poolserve_connections_refused{reason="full"}) and says so in a
WARNING line at most once a second.

The answer is closed the way nginx's lingering close does it: the server shuts its side for
writing and reads, and drops, whatever request the client sent, until the client closes or
LINGER_S pass. Closing a socket with unread bytes sends a reset, which can destroy the 503 in the
client's buffers before it reads it.
"""

from __future__ import annotations

import asyncio
import logging
import math
import socket

from apiserver.errors import error_bytes
from apiserver.metrics import CONNECTIONS_REFUSED

logger = logging.getLogger("poolserve.api")

# How long a refused connection may stay open for its client to read the answer and close.
LINGER_S = 2.0
# Refused connections lingering at once, per server: each holds a file descriptor, and saving those
# is what the limit is for. Past it, connections wait in the queue.
MAX_LINGERING = 64
LOG_INTERVAL_S = 1.0


class ThrottledCount:
    """Events counted for a log line written at most once per `interval`: the first at once, those after it
    summed into the next line."""

    def __init__(self, interval: float):
        self.interval = interval
        self.pending = 0
        self.reported_at = -math.inf

    def add(self, now: float) -> int:
        """Count one; returns how many to report now (0: not yet, see `due_at`)."""
        self.pending += 1
        return self.take(now)

    def take(self, now: float) -> int:
        if not self.pending or now - self.reported_at < self.interval:
            return 0
        count, self.pending, self.reported_at = self.pending, 0, now
        return count

    def drain(self) -> int:
        """Everything held back, whatever the time."""
        count, self.pending = self.pending, 0
        return count

    def due_at(self) -> float | None:
        """When the events held back may be reported; None when there are none."""
        return self.reported_at + self.interval if self.pending else None


class RefusedConnection(asyncio.Protocol):
    """Writes the answer, shuts the write side, drops what the client sends and closes at its EOF or after LINGER_S."""

    def __init__(self, answer: bytes, on_closed: asyncio.Event | None = None):
        self.answer = answer
        self.closed = on_closed
        self.linger: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        transport.write(self.answer)
        if transport.can_write_eof():
            transport.write_eof()
        self.linger = asyncio.get_running_loop().call_later(LINGER_S, transport.close)

    def data_received(self, data: bytes) -> None:
        pass  # the request nobody will serve

    def eof_received(self) -> bool:
        return False  # the client has closed: the transport closes too

    def connection_lost(self, exc: Exception | None) -> None:
        if self.linger is not None:
            self.linger.cancel()
        if self.closed is not None:
            self.closed.set()


class Refuser:
    """Answers, counts and logs the connections one API server refuses because every server is full."""

    def __init__(self, server_label: str, max_connections: int):
        self.server_label = server_label
        self.max_connections = max_connections
        self.answer = error_bytes(
            503,
            f"Every API server holds its limit of {max_connections} connections (--max-connections-per-server); "
            "retry shortly.",
            "server_full",
        )
        self.lingering: set[asyncio.Task[None]] = set()
        self.report = ThrottledCount(LOG_INTERVAL_S)
        self._counted = CONNECTIONS_REFUSED.labels(server=server_label, reason="full")
        self._report_handle: asyncio.TimerHandle | None = None

    @property
    def has_room(self) -> bool:
        return len(self.lingering) < MAX_LINGERING

    def refuse(self, conn: socket.socket) -> None:
        self._counted.inc()
        task = asyncio.get_running_loop().create_task(self._answer(conn))
        self.lingering.add(task)
        task.add_done_callback(self.lingering.discard)
        self._note()

    def close(self) -> None:
        """Write what a pending report held back, now: the server stops accepting."""
        if self._report_handle is not None:
            self._report_handle.cancel()
            self._report_handle = None
        count = self.report.drain()
        if count:
            self._log(count)

    async def _answer(self, conn: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        closed = asyncio.Event()
        try:
            await loop.connect_accepted_socket(lambda: RefusedConnection(self.answer, closed), conn)
        except OSError:
            conn.close()
            return
        await closed.wait()

    def _note(self) -> None:
        count = self.report.add(asyncio.get_running_loop().time())
        if count:
            self._log(count)
        elif self._report_handle is None:
            due = self.report.due_at()
            assert due is not None
            self._report_handle = asyncio.get_running_loop().call_at(due, self._on_report_due)

    def _on_report_due(self) -> None:
        self._report_handle = None
        self._flush()

    def _flush(self) -> None:
        count = self.report.take(asyncio.get_running_loop().time())
        if count:
            self._log(count)

    def _log(self, count: int) -> None:
        logger.warning(
            "refused %d new connection(s) with 503: every API server holds its --max-connections-per-server "
            "limit of %d",
            count,
            self.max_connections,
        )
