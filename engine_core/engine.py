"""The engine process's shell around EngineCore: the I/O thread, heartbeats, the flight recorder, and replies.

The I/O thread owns the ROUTER socket; this loop takes what it queued, runs one step at a time
(core.py, no I/O), and queues each API server's replies for that thread, waking it over an inproc socket.
"""

from __future__ import annotations

import logging
import queue
import time
from collections.abc import Callable

import zmq

from engine_core.admission import AdmissionLimit
from engine_core.core import EngineCore, StepOutputs, requests_of
from engine_core.embedding_cache import EmbeddingCache
from engine_core.flight_recorder import FlightRecorder
from engine_core.io_thread import OUTBOX_ENDPOINT, EngineIO, InboxItem
from engine_core.loader import LoadedModel
from engine_core.metrics import INPUTS_QUEUED, REQUESTS_RUNNING, REQUESTS_WAITING, engine_labels
from engine_core.request_state import PendingRequest
from engine_core.scheduler import DEFAULT_PRIORITY, PriorityPolicy
from poolserve.protocol import EngineWire

logger = logging.getLogger("poolserve.engine")

IDLE_WAIT_S = 0.2
BEAT_INTERVAL_S = 1.0


class EngineProcess:
    """Runs EngineCore's steps on the main thread while the I/O thread serves the socket."""

    def __init__(
        self,
        loaded: LoadedModel,
        endpoint: str,
        *,
        admission: AdmissionLimit,
        recorder: FlightRecorder,
        beat: Callable[[], None],
        cache: EmbeddingCache | None = None,
        priority: PriorityPolicy = DEFAULT_PRIORITY,
    ):
        self.core = EngineCore(loaded, admission, cache, priority)
        self.admission = admission
        self.recorder = recorder
        self._beat = beat
        self._last_beat = 0.0
        # The gauges' last values: (requests waiting, requests running, inputs queued).
        self._shown: tuple[int, int, int] | None = None
        # Set while a forward pass runs; the I/O thread reports how long it has run (a hang).
        self._step_started: float | None = None
        suspects = recorder.read_suspects()
        if suspects:
            logger.warning("%d request(s) were running when the last engine died", sum(map(len, suspects.values())))
        recorder.open()
        self._context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        self.io = EngineIO(
            self._context, endpoint, loaded.card, admission=admission, suspects=suspects, stalled_for=self.stalled_for
        )
        self._outbox = self._context.socket(zmq.PUSH)
        self._outbox.setsockopt(zmq.LINGER, 0)
        self._outbox.connect(OUTBOX_ENDPOINT)
        self._wire = EngineWire()
        self.should_exit = False

    def run(self) -> None:
        self.io.start()
        try:
            while not self.should_exit:
                self._heartbeat()
                # Between steps: new requests, and aborts that save the compute of inputs not run yet.
                self._drain(block=not self.core.has_work())
                from_cache = self.core.take_answered_from_cache()
                if from_cache is not None:
                    self._reply(from_cache)
                batch = self.core.next_batch()
                if batch is None:
                    continue
                # Written before the forward pass, so that a restarted engine knows what was running.
                self.recorder.record(request.key for request in requests_of(batch))
                self._step_started = time.monotonic()
                try:
                    outputs = self.core.run_batch(batch)
                finally:
                    self._step_started = None
                    self.recorder.clear()
                self._reply(outputs)
        finally:
            self.io.stop()
            self._outbox.close()
            self._context.term()
            self.recorder.close()

    def request_exit(self) -> None:
        self.should_exit = True

    def stalled_for(self) -> float:
        started = self._step_started
        return 0.0 if started is None else time.monotonic() - started

    def _heartbeat(self) -> None:
        """Beats come from this loop, so a forward pass that never returns stops them."""
        now = time.monotonic()
        if now - self._last_beat >= BEAT_INTERVAL_S:
            self._last_beat = now
            self._beat()
        # Written only when they change: each write is a label look-up and a write to the metric file, and
        # this runs every step.
        shown = (self.core.waiting, self.core.running, self.admission.inputs)
        if shown != self._shown:
            self._shown = shown
            engine = engine_labels()
            REQUESTS_WAITING.labels(*engine).set(shown[0])
            REQUESTS_RUNNING.labels(*engine).set(shown[1])
            INPUTS_QUEUED.labels(*engine).set(shown[2])

    def _drain(self, block: bool) -> None:
        try:
            items = self.io.inbox.get(timeout=IDLE_WAIT_S) if block else self.io.inbox.get_nowait()
            while True:
                self._accept(items)
                items = self.io.inbox.get_nowait()
        except queue.Empty:
            return

    def _accept(self, items: list[InboxItem]) -> None:
        add, abort = self.core.add, self.core.abort
        for item in items:
            if isinstance(item, PendingRequest):
                add(item)
            else:
                identity, message = item
                abort(identity, message.ids)

    def _reply(self, step: StepOutputs) -> None:
        """One message per API server, with everything of its that this step finished or failed; one wake-up
        of the I/O thread for all of them."""
        servers = step.servers
        for identity in servers:
            frames = self._wire.encode_outputs(step.outputs.get(identity, []), step.failures.get(identity, []))
            self.io.replies.put([identity, *frames])
        if servers:
            self._outbox.send(b"")
