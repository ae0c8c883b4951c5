"""The engine's I/O thread: owns the ROUTER socket that every API server talks to.

It decodes what arrives (dropping anything malformed with a log line, never crashing), answers
handshakes and pings itself so that they never wait behind a forward pass, hands requests to the
scheduler thread through a queue, and forwards the scheduler's replies back out. ZeroMQ sockets
are not thread-safe, so replies reach this thread through a queue too, with a one-frame wake-up over an
inproc PUSH/PULL pair: passing the reply's frames over that pair cost the scheduler thread a Python send
per frame (one per finished request), and this thread a receive per frame.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable

import zmq

from engine_core.admission import AdmissionLimit
from engine_core.request_state import InvalidRequest, PendingRequest, check_request
from poolserve.model_card import ModelCard
from poolserve.protocol import (
    ERROR_INVALID,
    ERROR_OVERLOADED,
    Abort,
    EngineRequest,
    EngineWire,
    ErrorCode,
    Frame,
    Hello,
    Ping,
    Pong,
    ProtocolError,
    Ready,
    RequestFailed,
)

logger = logging.getLogger("poolserve.engine")

OUTBOX_ENDPOINT = "inproc://engine-outbox"
# An int, not zmq.SNDMORE: `SNDMORE | flags`, as send_multipart computes it for every frame, is an enum operation
# in Python, and a reply has a frame per finished request.
MORE = int(zmq.SNDMORE)

# What the scheduler thread receives: a request to run, or (identity, Abort).
InboxItem = PendingRequest | tuple[bytes, Abort]
# The inbox takes what one pass over the socket read, in order, as one list (at most this many): a put per
# request woke the scheduler thread, and handed it the GIL, once per request.
INBOX_BATCH = 256


class EngineIO:
    def __init__(
        self,
        context: zmq.Context[zmq.Socket[bytes]],
        endpoint: str,
        card: ModelCard,
        *,
        admission: AdmissionLimit,
        suspects: dict[bytes, list[int]],
        stalled_for: Callable[[], float],
    ):
        self.card = card
        self.admission = admission
        self.inbox: queue.SimpleQueue[list[InboxItem]] = queue.SimpleQueue()
        self._arrived: list[InboxItem] = []
        # Replies from the scheduler thread, each [identity, *frames]; put before the wake-up is sent.
        self.replies: queue.SimpleQueue[list[Frame]] = queue.SimpleQueue()
        self._wire = EngineWire()
        self._suspects = suspects
        self._stalled_for = stalled_for
        self._router = context.socket(zmq.ROUTER)
        self._router.setsockopt(zmq.LINGER, 0)
        self._router.bind(endpoint)
        self._outbox = context.socket(zmq.PULL)
        self._outbox.setsockopt(zmq.LINGER, 0)
        self._outbox.bind(OUTBOX_ENDPOINT)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="engine-io", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self._router.close()
        self._outbox.close()

    def _run(self) -> None:
        poller = zmq.Poller()
        poller.register(self._router, zmq.POLLIN)
        poller.register(self._outbox, zmq.POLLIN)
        while not self._stop.is_set():
            events = dict(poller.poll(100))
            if self._outbox in events:
                self._forward_outputs()
            if self._router in events:
                self._receive()

    def _forward_outputs(self) -> None:
        """Every reply queued so far. A wake-up read here may belong to a reply sent out already by the
        previous call: the queue is what counts, and each reply is queued before its wake-up is sent."""
        while True:
            try:
                self._outbox.recv(zmq.NOBLOCK)
            except zmq.Again:
                break
        while True:
            try:
                frames = self.replies.get_nowait()
            except queue.Empty:
                return
            send_frames(self._router, frames)

    def _receive(self) -> None:
        try:
            while True:
                try:
                    frames = self._router.recv_multipart(zmq.NOBLOCK)
                except zmq.Again:
                    return
                try:
                    self._handle(frames)
                except Exception:
                    # Whatever a peer sends must not take the engine down.
                    logger.exception("dropped a message the engine could not handle")
                if len(self._arrived) >= INBOX_BATCH:
                    self._pass_on()
        finally:
            self._pass_on()

    def _pass_on(self) -> None:
        if self._arrived:
            self.inbox.put(self._arrived)
            self._arrived = []

    def _handle(self, frames: list[bytes]) -> None:
        if len(frames) < 2:
            logger.warning("dropped a message of %d frame(s) with no body", len(frames))
            return
        identity = frames[0]
        try:
            msg = self._wire.decode(frames[1:])
        except ProtocolError as exc:
            request_id = self._wire.request_id_of(frames[1:])
            if request_id is None:
                logger.warning("dropped an undecodable message from %r: %s", identity, exc)
            else:
                logger.warning("refused request %d from %r: %s", request_id, identity, exc)
                self._refuse(identity, request_id, f"invalid request: {exc}", ERROR_INVALID)
            return
        match msg:
            case EngineRequest():
                self._admit(identity, msg)
            case Abort():
                self._arrived.append((identity, msg))
            case Ping():
                admission = self.admission
                self._send(
                    identity,
                    self._wire.encode(Pong(msg.nonce, self._stalled_for(), admission.inputs, admission.tokens)),
                )
            case Hello():
                suspects = self._suspects.pop(identity, [])
                logger.info(
                    "API server %d (pid %d) connected%s",
                    msg.server_index,
                    msg.pid,
                    f"; {len(suspects)} of its requests were running when the last engine died" if suspects else "",
                )
                self._send(identity, self._wire.encode(Ready(self.card, suspects)))

    def _admit(self, identity: bytes, msg: EngineRequest) -> None:
        try:
            request = check_request(identity, msg, self.card)
        except InvalidRequest as exc:
            logger.warning("refused request %d from %r: %s", msg.id, identity, exc)
            self._refuse(identity, msg.id, f"invalid request: {exc}", ERROR_INVALID)
            return
        if not self.admission.try_admit(
            request.count, request.total_cost, force=msg.attempt > 0, priority=request.priority
        ):
            self._refuse(
                identity,
                msg.id,
                f"the server is at its queue limit ({self.admission.max_inputs} inputs, "
                f"{self.admission.max_tokens} tokens waiting or running)",
                ERROR_OVERLOADED,
            )
            return
        self._arrived.append(request)

    def _refuse(self, identity: bytes, request_id: int, error: str, code: ErrorCode) -> None:
        self._send(identity, self._wire.encode_outputs([], [RequestFailed(request_id, code, error)]))

    def _send(self, identity: bytes, frames: list[Frame]) -> None:
        send_frames(self._router, [identity, *frames])


def send_frames(socket: zmq.Socket[bytes], frames: list[Frame]) -> None:
    """send_multipart without its per-frame type checks and enum arithmetic. copy=False: pyzmq copies a frame
    under its copy threshold (64 kB) anyway and sends a larger one (a long per-token answer) without a copy."""
    send = socket.send
    for frame in frames[:-1]:
        send(frame, MORE, copy=False)
    send(frames[-1], 0, copy=False)
