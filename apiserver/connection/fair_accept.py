"""Fair accept on the shared listening socket: a server above its share stops accepting for a moment.

Left to the kernel, one shared accept queue feeds the process that waits on it most recently,
usually the busiest one, and a keep-alive connection then stays with that process for its whole
life: measured here, 32 keep-alive clients over 2 API servers landed 32/0. So every API server
publishes what it holds on the load board (apiserver/load_board.py) and, before each accept,
compares itself with its siblings: above the least-loaded one plus a small slack, it takes its
listening socket out of its event loop and the next connection goes to a sibling (nginx's
`accept_mutex` and its worker-connection limit work the same way). The least-loaded server
never pauses, so with all servers at their share nothing waits.

Pausing never closes or drains the listening socket: it is shared with the siblings and the
supervisor, and a connection queued on it stays queued. A paused server waits for one to queue
(the socket readable) and then looks at the queue every few milliseconds until it is empty again;
when the queue has stayed non-empty for HANDOFF_S with no server taking anything off it (the
sibling that should take it is busy on its GIL, stopped, or dying), the connection at its head is
taken anyway, so balance never costs more than that in latency. A queue that stays non-empty
while siblings drain it (a burst of connections opened at once) is left to them: counting only
how long the queue was non-empty, a paused server took a burst's connections every 5 ms and one of
four servers ended a burst of 32 holding 11. While
nothing is queued a paused server does nothing: it used to look every 5 ms, and one idle keep-alive
connection (which keeps its server above a sibling holding none) cost 200 wake-ups a second for
as long as it stayed open.

A server holding --max-connections-per-server connections is over its share whatever its
siblings hold, and a full sibling is left out of the comparison (it cannot take the next
connection), so new connections go to servers with room. When every server is full, a connection
that has waited HANDOFF_S is accepted only to be answered 503 (apiserver/connection/refusal.py). The limit
sits below the process's file-descriptor limit, so accept() keeps working for that; when it fails
anyway (EMFILE and the like), the server backs off and the failure is counted too.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import select
import socket
import time
from collections.abc import Callable

from apiserver.connection.client_share import ClientShare, ShareRefuser, peer_host
from apiserver.connection.refusal import Refuser
from apiserver.metrics import ACCEPT_PAUSES, ACCEPT_TAKEOVERS, CONNECTIONS, CONNECTIONS_REFUSED, OPEN_CONNECTIONS
from poolserve.config import AcceptBalance
from poolserve.load_board import LoadBoard, SlotState, Word

logger = logging.getLogger("poolserve.api")

# A paused server looks at the queue this often while a connection waits there.
PAUSED_POLL_S = 0.005
# A connection queued this long is taken by a paused server: the server that should take it is
# busy (a GIL-bound request on its loop), stopped or dying.
HANDOFF_S = 0.02
# Each server writes its beat this often; a sibling silent for STALE_AFTER_S is left out of the
# comparison (a stuck loop cannot accept: deferring to it would only add HANDOFF_S to each connection).
BEAT_INTERVAL_S = 0.1
STALE_AFTER_NS = 500_000_000
# Back off this long when accept() fails for lack of file descriptors or memory (asyncio does 1 s).
RESOURCE_BACKOFF_S = 0.5
# Accepts per wake-up before the loop serves what it has: with a queue of thousands, requests on
# connections already open still get their turn.
ACCEPTS_PER_WAKEUP = 32
# How far above the least-loaded sibling a server may be and still accept. 0 measured best
# (docs/benchmarks.md, "Connections over API servers"): with 1, a proxy's two hot connections
# stayed on one server (largest share of inputs 0.77 against 0.58), and four servers ended bursts
# at up to 10/10/6/6 instead of 9/8/8/7.
SLACK = 0


def share_load(connections: int, in_flight: int, balance_by: AcceptBalance) -> int:
    """The number servers compare: what a new connection would add to."""
    if balance_by == "connections":
        return connections
    if balance_by == "requests":
        return in_flight
    if balance_by == "none":
        return 0  # nobody is ever over its share: the kernel alone decides
    return connections + in_flight


def is_over_share(own: int, siblings: list[int]) -> bool:
    """Above the least-loaded sibling by more than the slack (SLACK, plus 1/16 of the load when loads
    are large, so thousands of connections do not pause on every accept)."""
    if not siblings:
        return False
    least = min(siblings)
    return own > least + SLACK + least // 16


class ServerLoad:
    """This process's open connections and requests in flight, counted here and published on its slot."""

    def __init__(self, board: LoadBoard, slot: int, server_index: int):
        self.board = board
        self.slot = slot
        # The `server` label of this process's metrics.
        self.label = str(server_index)
        self.connections = 0
        self.in_flight = 0
        self.accepted = 0
        # Called when this server's load falls: a paused acceptor may take connections again.
        self.on_lighter: Callable[[], None] = lambda: None
        self._open_gauge = OPEN_CONNECTIONS.labels(server=self.label)
        self._opened = CONNECTIONS.labels(server=self.label)

    def connection_accepted(self) -> None:
        """Taken off the shared queue, to be served or refused."""
        self.accepted += 1
        self.board.write(self.slot, Word.ACCEPTED, self.accepted)

    def connection_opened(self) -> None:
        self.connections += 1
        self.board.write(self.slot, Word.CONNECTIONS, self.connections)
        self._open_gauge.inc()
        self._opened.inc()

    def connection_closed(self) -> None:
        self.connections -= 1
        self.board.write(self.slot, Word.CONNECTIONS, self.connections)
        self._open_gauge.dec()
        self.on_lighter()

    def request_started(self) -> None:
        self.in_flight += 1
        self.board.write(self.slot, Word.IN_FLIGHT, self.in_flight)

    def request_finished(self) -> None:
        self.in_flight -= 1
        self.board.write(self.slot, Word.IN_FLIGHT, self.in_flight)
        self.on_lighter()

    def beat(self) -> None:
        self.board.write(self.slot, Word.BEAT_NS, time.monotonic_ns())

    def set_state(self, state: SlotState) -> None:
        self.board.write(self.slot, Word.STATE, state)


class FairAcceptor:
    """Accepts from the shared socket while this server holds no more than its share; hands each
    connection to the event loop's transport with the HTTP protocol (uvicorn's)."""

    def __init__(
        self,
        sock: socket.socket,
        protocol_factory: Callable[[], asyncio.Protocol],
        load: ServerLoad,
        *,
        balance_by: AcceptBalance,
        max_connections: int,
        clients: ClientShare | None = None,
    ):
        self.sock = sock
        self.protocol_factory = protocol_factory
        self.load = load
        self.balance_by = balance_by
        self.max_connections = max_connections
        self.refuser = Refuser(load.label, max_connections)
        # Each client address's connections here (--max-connections-per-client); the protocol releases them.
        self.clients = clients or ClientShare(0)
        self.share_refuser = ShareRefuser(load.label, self.clients.limit)
        self.is_reading = False
        # Paused, and waiting for a connection to queue (the socket readable) before it looks again.
        self.is_watching = False
        self.is_closed = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._poll_handle: asyncio.TimerHandle | None = None
        self._beat_handle: asyncio.TimerHandle | None = None
        self._queued_since: float | None = None
        # Every server's accepts (the board's total) when _queued_since was last set.
        self._accepted_then = 0
        self._queue_poller = select.poll()
        self._queue_poller.register(sock.fileno(), select.POLLIN)
        self._connecting: set[asyncio.Task[None]] = set()
        self._pauses = ACCEPT_PAUSES.labels(server=load.label)
        self._takeovers = ACCEPT_TAKEOVERS.labels(server=load.label)

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        assert self._loop is not None, "FairAcceptor.start() first"
        return self._loop

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self.sock.setblocking(False)
        self.load.on_lighter = self._on_lighter
        self._beat()  # before the state: siblings never see an accepting slot with a stale beat
        self.load.set_state(SlotState.ACCEPTING)
        self._resume()

    def close(self) -> None:
        """Stop accepting for good (uvicorn's shutdown calls this); the socket itself stays open for the
        siblings and is closed by uvicorn, this process's copy only."""
        if self.is_closed:
            return
        self.is_closed = True
        self.load.set_state(SlotState.DRAINING)
        self.load.on_lighter = lambda: None
        self._stop_reading()
        for handle in (self._poll_handle, self._beat_handle):
            if handle is not None:
                handle.cancel()
        self.refuser.close()
        self.share_refuser.close()

    async def wait_closed(self) -> None:
        return None

    # The gate ----------------------------------------------------------------------------------

    def is_full(self) -> bool:
        return self.load.connections >= self.max_connections

    def is_over_share(self) -> bool:
        if self.is_full():
            return True
        if self.balance_by == "none":
            return False
        siblings = self.load.board.accepting_siblings(self.load.slot, STALE_AFTER_NS)
        balance_by = self.balance_by
        own = share_load(self.load.connections, self.load.in_flight, balance_by)
        # A full sibling cannot take the next connection: comparing with it would only delay it by HANDOFF_S.
        return is_over_share(
            own,
            [
                share_load(s.connections, s.in_flight, balance_by)
                for s in siblings
                if s.connections < self.max_connections
            ],
        )

    def is_every_server_full(self) -> bool:
        if not self.is_full():
            return False
        siblings = self.load.board.accepting_siblings(self.load.slot, STALE_AFTER_NS)
        return all(s.connections >= self.max_connections for s in siblings)

    def _on_readable(self) -> None:
        for _ in range(ACCEPTS_PER_WAKEUP):
            if self.is_over_share():
                self._pause()
                return
            if not self._accept_one():
                return

    def _pause(self, look_again_in: float = PAUSED_POLL_S) -> None:
        if self.is_reading:
            self._pauses.inc()
        self._stop_reading()
        self._queued_since = None
        if self._poll_handle is not None:
            self._poll_handle.cancel()
            self._poll_handle = None
        self._schedule_poll(look_again_in)

    def _resume(self) -> None:
        if self.is_closed or self.is_reading:
            return
        self._stop_reading()
        if self._poll_handle is not None:
            self._poll_handle.cancel()
            self._poll_handle = None
        # Level-triggered: a connection already queued wakes the reader at once.
        self.loop.add_reader(self.sock.fileno(), self._on_readable)
        self.is_reading = True

    def _stop_reading(self) -> None:
        """No callback on the socket: neither accepting nor watching."""
        if self.is_reading or self.is_watching:
            self.loop.remove_reader(self.sock.fileno())
        self.is_reading = self.is_watching = False

    def _watch(self) -> None:
        """Paused with nothing queued: the next connection to queue wakes it (level-triggered, so one queued
        already does at once), and until then it costs nothing."""
        if self.is_closed or self.is_reading or self.is_watching:
            return
        self.loop.add_reader(self.sock.fileno(), self._on_queued)
        self.is_watching = True

    def _on_queued(self) -> None:
        # Looked at every PAUSED_POLL_S while it stays queued, not on every wake-up: level-triggered, the socket
        # stays readable until someone accepts, and the loop would spin.
        self._stop_reading()
        self._poll_paused()

    def _on_lighter(self) -> None:
        if not self.is_reading and not self.is_closed and not self.is_over_share():
            self._resume()

    def _poll_paused(self) -> None:
        self._poll_handle = None
        if self.is_closed:
            return
        if not self.is_over_share():
            self._resume()
            return
        if self._queue_poller.poll(0):
            now = self.loop.time()
            accepted = self.load.board.accepted_total()
            if self._queued_since is None or accepted != self._accepted_then:
                # A server took a connection off the queue: the one at its head now has waited since then.
                self._queued_since = now
                self._accepted_then = accepted
            elif now - self._queued_since >= HANDOFF_S:
                if not self.is_full():
                    self._queued_since = None
                    if self._accept_one():
                        self._takeovers.inc()
                elif self.is_every_server_full():
                    self._refuse_queued()
                # else: a sibling with room takes it, or stops beating and is left out
            self._schedule_poll(PAUSED_POLL_S)
        else:
            self._queued_since = None
            self._watch()

    def _refuse_queued(self) -> None:
        """Answer 503 to what the queue holds, a batch at a time; a queue still not empty after the batch is
        refused on the next look, 5 ms later, with no new wait (the servers have been full all along)."""
        for _ in range(ACCEPTS_PER_WAKEUP):
            if not self.refuser.has_room:
                return
            if not self._accept_one(refuse=True):
                self._queued_since = None
                return

    def _schedule_poll(self, delay: float) -> None:
        if self._poll_handle is None and not self.is_closed:
            self._poll_handle = self.loop.call_later(delay, self._poll_paused)

    def _beat(self) -> None:
        self.load.beat()
        self._beat_handle = self.loop.call_later(BEAT_INTERVAL_S, self._beat)

    # Accepting ---------------------------------------------------------------------------------

    def _accept_one(self, *, refuse: bool = False) -> bool:
        """Accept one queued connection and start serving it (or refusing it); False when there was none to take."""
        try:
            conn, _ = self.sock.accept()
        except (BlockingIOError, InterruptedError):
            return False
        except ConnectionAbortedError:
            return True  # the client gave up while queued; the next one may be there
        except OSError as exc:
            if exc.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                CONNECTIONS_REFUSED.labels(server=self.load.label, reason=errno.errorcode[exc.errno].lower()).inc()
                logger.warning(
                    "accept() failed: %s; this API server stops accepting for %.1fs and its siblings take new "
                    "connections (%d open here)",
                    exc.strerror,
                    RESOURCE_BACKOFF_S,
                    self.load.connections,
                )
                self._pause(look_again_in=RESOURCE_BACKOFF_S)
                return False
            # Anything else concerns that one connection (asyncio's accept loop does the same).
            logger.warning("accept() failed: %s", exc)
            return True
        self.load.connection_accepted()
        conn.setblocking(False)
        if refuse:
            self.refuser.refuse(conn)
            return True
        host = peer_host(conn)
        if not self.clients.admit(host):
            if self.share_refuser.has_room:
                self.share_refuser.refuse(conn)
            else:  # one client's refusals hold no more descriptors than MAX_LINGERING: the rest are closed at once
                conn.close()
            return True
        if conn.family in (socket.AF_INET, socket.AF_INET6):
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.load.connection_opened()
        task = self.loop.create_task(self._serve(conn, host))
        self._connecting.add(task)
        task.add_done_callback(self._connecting.discard)
        return True

    async def _serve(self, conn: socket.socket, host: str) -> None:
        try:
            _, protocol = await self.loop.connect_accepted_socket(self.protocol_factory, conn)
        except Exception:
            # The protocol never saw the connection, so its close is not counted there.
            logger.exception("could not start serving an accepted connection")
            self.clients.release(host)
            conn.close()
            self.load.connection_closed()
            return
        if self.is_closed:
            # uvicorn's shutdown closes this acceptor, then tells each connection it serves to finish and close. One
            # accepted in the loop turn before joins those connections only now, after they were told: told here,
            # or a keep-alive client would keep it open, and the stop wait out --shutdown-timeout.
            shutdown = getattr(protocol, "shutdown", None)
            if shutdown is not None:
                shutdown()
