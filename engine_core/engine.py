"""The engine process's shell around EngineCore: the I/O thread, heartbeats, the flight recorder, and replies.

The I/O thread owns the ROUTER socket; this loop takes what it queued, runs one step at a time
(core.py, no I/O), and queues each API server's replies for that thread, waking it over an inproc socket.

Two passes at once on a CPU. Where the model runs through torch on a CPU with two or more engine threads
(`LoadedModel.passes_at_once`), a second lane (a thread of its own) runs a pass beside the main loop's when at least
half as many inputs are queued behind the main loop's pass as it holds: both then run on one torch thread each (and
while the main loop's runs, the second lane takes in what comes and starts once that much is queued). Otherwise the
main loop's pass has the threads engine_core/threads.py gives it, as with one lane, so a lone request and the
half-batches that alternate at 32 clients of single sentences are served as before. A pass on several threads always
runs on the main thread: OpenMP's parallel regions cost more when another thread starts them (docs/benchmarks.md,
"Two passes at once"). The core is shared under one lock, held for everything but the forward passes themselves;
each lane answers over its own inproc socket.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Iterable

import zmq

from engine_core.admission import AdmissionLimit
from engine_core.core import EngineCore, StartedPass, StepOutputs
from engine_core.embedding_cache import EmbeddingCache
from engine_core.flight_recorder import FlightRecorder
from engine_core.io_thread import OUTBOX_ENDPOINT, EngineIO, InboxItem
from engine_core.loader import LoadedModel
from engine_core.metrics import INPUTS_QUEUED, REQUESTS_RUNNING, REQUESTS_WAITING, engine_labels
from engine_core.request_state import PendingRequest
from engine_core.scheduler import DEFAULT_PRIORITY, PriorityPolicy, WorkItem
from engine_core.threads import ThreadPlan
from poolserve.protocol import EngineWire

logger = logging.getLogger("poolserve.engine")

IDLE_WAIT_S = 0.2
BEAT_INTERVAL_S = 1.0
# The lanes: the main loop's, and the second lane's (two passes at once on a CPU).
MAIN, LANE = 0, 1
# How often the second lane looks for work while the main loop's one-thread pass runs.
LANE_POLL_S = 0.002
# A pass waits for the rest of a cohort of at most COHORT_MOST requests (_cohort_hold) up to COHORT_HOLD_SHARE of the
# last pass's time after it ended, at least COHORT_HOLD_S and at most COHORT_HOLD_MOST_S: a second sentence in a pass
# costs 0.4-0.6 of a pass of one (docs/benchmarks.md, "Two clients in step"), so a hold of 0.3 of a pass costs less
# than the pairing saves. A client's round trip from its answer to its next request reaching the engine is ~1.5-2 ms
# on an AVX512 host whose lone pass takes 5-7 ms, and longer on a slower one (AVX2, 19 ms a lone pass: 3 ms paired
# 1.5-1.7 inputs a pass at two clients, 8 ms 2.0).
COHORT_HOLD_S = 0.003
COHORT_HOLD_SHARE = 0.3
COHORT_HOLD_MOST_S = 0.010
COHORT_MOST = 4


class EngineProcess:
    """Runs EngineCore's steps on the main thread (and a second lane's beside them) while the I/O thread serves the
    socket."""

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
        # Each lane's forward pass while it runs: its start (the I/O thread reports how long the oldest has run: a
        # hang), its requests (the flight recorder holds every lane's) and its batch.
        self._passes: dict[int, StartedPass] = {}
        self._lock = threading.Lock()
        # torch's thread count is each OS thread's own: a plan per lane
        self._plans = {MAIN: self.core.threads, LANE: ThreadPlan(loaded.card.device, self.core.threads.full)}
        self._lane_wanted = threading.Event()
        # Until when the next pass may wait for the rest of the last pass's cohort (`hold_limit` after it ended), and
        # that cohort: the requests it answered and those queued behind it then.
        self._hold_until = 0.0
        self._cohort = 0
        self._lane = (
            threading.Thread(target=self._run_lane, name="engine-lane", daemon=True)
            if loaded.passes_at_once > 1
            else None
        )
        # two clients' requests on the two lanes rather than held for one pass (pair_on_lanes)
        self._pairs_on_lanes = loaded.pairs_on_lanes and self._lane is not None
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
        if self._lane is not None:
            self._lane.start()
        try:
            while not self.should_exit:
                with self._lock:
                    self._heartbeat()
                    # Between steps: new requests, and aborts that save the compute of inputs not run yet.
                    self._drain()
                    from_cache = self.core.take_answered_from_cache()
                    if from_cache is not None:
                        self._reply(from_cache, self._outbox)
                    hold = self._cohort_hold()
                    started = None if hold else self._start_pass(MAIN)
                if hold:
                    self._wait_for_work(hold)
                    continue
                if started is None:
                    self._wait_for_work()
                    continue
                self._run_pass(MAIN, started, self._outbox)
        finally:
            self.should_exit = True
            self._lane_wanted.set()
            if self._lane is not None:
                self._lane.join()
            self.io.stop()
            self._outbox.close()
            self._context.term()
            self.recorder.close()

    def _run_lane(self) -> None:
        """The second lane: a pass on one thread whenever the main loop runs one on one thread and work is queued.
        While the main loop's pass runs nobody else takes in what the I/O thread queues, so this lane does, every
        LANE_POLL_S, and starts a pass once at least half as many inputs are queued as the main loop's pass holds."""
        outbox = self._context.socket(zmq.PUSH)
        outbox.setsockopt(zmq.LINGER, 0)
        outbox.connect(OUTBOX_ENDPOINT)
        try:
            while not self.should_exit:
                self._lane_wanted.wait(IDLE_WAIT_S)
                with self._lock:
                    main = self._passes.get(MAIN)
                    if main is None or self._plans[MAIN].current != 1:
                        self._lane_wanted.clear()
                        continue
                    self._drain()
                    started = self._start_pass(LANE) if 2 * self.core.queued_inputs() >= len(main.batch) else None
                if started is None:
                    time.sleep(LANE_POLL_S)
                    continue
                self._run_pass(LANE, started, outbox)
        finally:
            outbox.close()

    def _start_pass(self, lane: int) -> StartedPass | None:
        """The lane's next batch, recorded and begun, with the lane's torch threads set; None when nothing is queued.
        Lock held."""
        batch = self.core.next_batch()
        if batch is None:
            return None
        one_thread = (
            lane == LANE
            or (self._lane is not None and (LANE in self._passes or self._more_queued(batch)))
            or (lane == MAIN and self._pairs_on_lanes and pair_on_lanes(self._cohort, batch))
        )
        most = max(1, self.core.card.max_batch_size // 2)
        if one_thread and len(batch) > most:
            # A pass on one thread holds at most half a batch: it lasts about what a whole one on two threads does,
            # so an urgent request still waits about one batch's time. The rest runs next, in either lane.
            batch = self.core.put_back(batch, most)
        started = self._passes[lane] = self.core.begin_pass(batch)
        # Written before the forward pass, so that a restarted engine knows what was running.
        self._record_running()
        plan = self._plans[lane]
        if one_thread:
            plan.use(1)  # two passes at once (or the second lane's about to start)
            if lane == MAIN:
                self._lane_wanted.set()
        else:
            plan.apply(started.padded, is_urgent=started.is_urgent, nothing_waits=started.nothing_waits)
        return started

    def _more_queued(self, batch: list[WorkItem]) -> bool:
        """Whether another pass is worth a lane of its own: at least half as many inputs are queued behind this batch
        as it holds (of this request or others; the second lane starts on no less), and the batch is not urgent
        (urgent work gets every thread). Less would leave the second lane idle and this pass on one thread."""
        return 2 * self.core.queued_inputs() >= len(batch) and not any(item.request.priority < 0 for item in batch)

    def _run_pass(self, lane: int, started: StartedPass, outbox: zmq.Socket[bytes]) -> None:
        """The forward pass outside the lock; its answers, and the end of its record, under it."""
        try:
            rows = self.core.forward(started)
        except Exception as exc:
            with self._lock:
                self._end_pass(lane)
                self._reply(self.core.fail_pass(started, exc), outbox)
            return
        with self._lock:
            self._end_pass(lane)
            step = self.core.end_pass(started, rows)
            ended = time.monotonic()
            self._hold_until = ended + hold_limit(ended - started.started)
            self._drain()  # what came during the pass: it waited behind it
            # the clients expected back; on lanes, a pair's other request may be running in the other lane
            running = self.core.running if self._pairs_on_lanes else 0
            self._cohort = sum(map(len, step.outputs.values())) + self.core.waiting + running
            self._reply(step, outbox)

    def _end_pass(self, lane: int) -> None:
        del self._passes[lane]
        self._record_running()

    def _record_running(self) -> None:
        """The flight record: every running pass's requests, or none."""
        if self._passes:
            self.recorder.record(request.key for started in self._passes.values() for request in started.requests)
        else:
            self.recorder.clear()

    def _cohort_hold(self) -> float:
        """How long the next pass waits for the rest of a small cohort (0: it starts now). Lock held.

        Two to four clients, each sending as its last answer comes, kept out of step: each request's pass waited for
        the other's, and the engine served two clients at about one's rate. When the last pass answered a few
        requests, or some waited behind it, their clients are expected back: a pass waits for as many requests as that
        cohort held (at most COHORT_MOST), up to a share of the last pass's time after it ended (`hold_limit`), and
        they run together on every thread (a second sentence costs 0.4-0.6 of the first). One client's cohort is one
        request: never held. A CPU engine that runs two lanes only; not while a pass runs (docs/benchmarks.md, "Two
        clients in step")."""
        if self._lane is None or self._passes or (self._pairs_on_lanes and self._cohort == 2):
            return 0.0  # a pair on lanes needs no hold: each starts as it comes
        return cohort_hold(self._cohort, self.core.waiting, self._hold_until, time.monotonic())

    def _wait_for_work(self, timeout: float = IDLE_WAIT_S) -> None:
        """Wait for the I/O thread's next items (at most `timeout`: IDLE_WAIT_S, for the heartbeat), then take them."""
        try:
            items = self.io.inbox.get(timeout=timeout)
        except queue.Empty:
            return
        with self._lock:
            self._accept(items)

    def request_exit(self) -> None:
        self.should_exit = True

    def stalled_for(self) -> float:
        """How long the longest-running forward pass has run (0 when none runs)."""
        started = [running.started for running in list(self._passes.values())]
        return 0.0 if not started else time.monotonic() - min(started)

    def _heartbeat(self) -> None:
        """Beats come from this loop, so a forward pass that never returns stops them."""
        now = time.monotonic()
        # Beats come from this loop between its passes; a second lane's pass that has run since before the last
        # beat holds them back, so that a pass that never returns stops them, in either lane.
        if beat_is_due(now, self._last_beat, [running.started for running in self._passes.values()]):
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

    def _drain(self) -> None:
        try:
            while True:
                self._accept(self.io.inbox.get_nowait())
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

    def _reply(self, step: StepOutputs, outbox: zmq.Socket[bytes]) -> None:
        """One message per API server, with everything of its that this step finished or failed; one wake-up
        of the I/O thread for all of them."""
        servers = step.servers
        for identity in servers:
            frames = self._wire.encode_outputs(step.outputs.get(identity, []), step.failures.get(identity, []))
            self.io.replies.put([identity, *frames])
        if servers:
            outbox.send(b"")


def pair_on_lanes(cohort: int, batch: list[WorkItem]) -> bool:
    """Where the runner pairs on lanes (LoadedModel.pairs_on_lanes): whether `batch` is one of two clients' requests,
    to run on one thread while the second lane takes the other's as it comes. Measured on ONNX Runtime's graph at two
    clients on a 2-core AVX2 host: 9-19 % more requests/s and a p99 ~20 % lower than one pass of both on every thread
    after the hold; torch, whose second sentence costs less, lost 9 % that way (docs/benchmarks.md). Urgent work keeps
    every thread."""
    return cohort == 2 and len(batch) == 1 and batch[0].request.priority >= 0


def hold_limit(last_pass_s: float) -> float:
    """How long after a pass of `last_pass_s` seconds ended the next may wait for the rest of its cohort."""
    return min(COHORT_HOLD_MOST_S, max(COHORT_HOLD_S, COHORT_HOLD_SHARE * last_pass_s))


def cohort_hold(cohort: int, waiting: int, hold_until: float, now: float) -> float:
    """Engine._cohort_hold's rule: seconds left to wait for `cohort` requests (at most COHORT_MOST) when `waiting` are
    queued, until `hold_until` (the last pass's end plus `hold_limit`); 0 when nothing waits, the cohort is one or is
    all there."""
    expected = min(cohort, COHORT_MOST)
    if expected <= 1 or waiting == 0 or waiting >= expected:
        return 0.0
    return max(0.0, hold_until - now)


def beat_is_due(now: float, last_beat: float, passes_started: Iterable[float]) -> bool:
    """Whether the main loop beats now: a beat interval since the last, and no pass (a second lane's) running since
    before the last beat. A pass that never returns stops the beats within two intervals, in either lane."""
    return now - last_beat >= BEAT_INTERVAL_S and all(started > last_beat for started in passes_started)
