"""Asyncio client of the engine cores: one connection per engine, one future per request id.

Each request goes to the live engine holding the fewest of this API server's inputs in flight
(engine_client/routing.py). Requests in flight are kept, with their frames: when an engine dies,
its requests move at once to the other live engines, or, with none left, wait for the first to
answer the handshake (pooling is a pure function of its input, so a resubmission is safe, and
clients see latency instead of errors).

Poison pills: the moment an engine is lost, its flight record (poolserve/flight_record.py) says which
of its requests its forward pass held. Those are blamed for the death and become suspects: none goes
to another engine, where a poison pill among them would kill a healthy engine too (both engines of
two went down, ~8 s with none). A suspect waits for its own engine's restart and runs there in a batch
of its own (`is_suspect`); the restarted engine's record then holds it alone, so a second death names
the culprit exactly: a request blamed for two deaths is failed as the likely cause (PoisonPill), and
its innocent batch-mates get their rows. The requests the dead engine only queued move to the other
engines at once, as any request. A suspect whose engine will not be back soon (the supervisor took it out
of service, or it did not start within `suspect_wait`) is tried on another engine after all, still alone.
A restarted engine names its predecessor's suspects in the handshake too; that blames a request only for
a death it was not blamed for yet (an API server that could not read the record).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from collections.abc import Callable, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field

import zmq.asyncio

from engine_client.errors import EngineError, EngineOverloaded, EngineUnavailable, PoisonPill
from engine_client.link import EngineLink
from engine_client.routing import EngineChooser
from poolserve.flight_record import read_record
from poolserve.model_card import ModelCard
from poolserve.protocol import (
    ERROR_OVERLOADED,
    Abort,
    ClientWire,
    EngineRequest,
    ForwardPass,
    OutputRows,
    Outputs,
    Pong,
    Ready,
)

logger = logging.getLogger("poolserve.engine_client")

# A request running in two forward passes that each killed an engine is failed as the cause.
MAX_BLAMES = 2
SEND_RETRY_S = 0.01
# How often the suspects waiting for their engine's restart are looked at (only while there are some).
SUSPECT_CHECK_S = 1.0


@dataclass(frozen=True, slots=True)
class PooledResult:
    """One float32 row per input (texts first, then images), a read-only view of the reply's frame; a sparse
    model's rows as their non-zero entries (SparseRows). `passes`: a traced request's forward passes."""

    vectors: OutputRows
    queue_time: float = 0.0
    inference_time: float = 0.0
    cached: int = 0
    passes: list[ForwardPass] | None = None


# An engine's death: (engine index, how many times this API server has lost that engine).
Death = tuple[int, int]


@dataclass(slots=True)
class InFlight:
    """A request sent and not yet answered (resubmissions bump its `attempt`), and the engine it was sent to (None
    while it waits for one). A suspect waits for the engine it was blamed for killing (`held_for`) since
    `held_since`."""

    request: EngineRequest
    future: asyncio.Future[PooledResult]
    engine: int | None = None
    blamed_for: set[Death] = field(default_factory=set)
    held_for: int | None = None
    held_since: float = 0.0

    @property
    def blames(self) -> int:
        return len(self.blamed_for)

    @property
    def inputs(self) -> int:
        return self.request.count


class EngineClient:
    def __init__(
        self,
        endpoints: Sequence[str],
        server_index: int,
        *,
        flight_records: Sequence[str] = (),
        wait_timeout: float = 30.0,
        suspect_wait: float = 300.0,
        is_out_of_service: Callable[[int], bool] = lambda index: False,
        stall_limit: float = 10.0,
    ):
        """`flight_records`: each engine's flight record file, in engine order (none: a dead engine's
        requests are blamed only when its restart names them). `suspect_wait`: how long a suspect waits for
        its engine's restart, as long as the supervisor lets an engine start (--engine-start-timeout), unless
        `is_out_of_service` says the supervisor took that engine out of service (apiserver: the load board)."""
        self.server_index = server_index
        self.flight_records = list(flight_records)
        self.suspect_wait = suspect_wait
        self.is_out_of_service = is_out_of_service
        self.wait_timeout = wait_timeout
        self.stall_limit = stall_limit
        self._context = zmq.asyncio.Context()
        self.links = [
            EngineLink(self._context, endpoint, index, server_index, self) for index, endpoint in enumerate(endpoints)
        ]
        self._wire = ClientWire()
        self._ids = itertools.count()
        self._in_flight: dict[int, InFlight] = {}
        # This server's inputs in flight on each engine: what the chooser compares.
        self._inputs = [0] * len(self.links)
        self._chooser = EngineChooser()
        # How many times each engine was lost: a death's number, so that one death blames a request once.
        self._losses = [0] * len(self.links)
        # Looks, while suspects wait for a restart, for those whose engine will not be back soon.
        self._release_handle: asyncio.TimerHandle | None = None
        self._releasing: set[asyncio.Task[None]] = set()
        # Set while at least one engine is ready.
        self._any_ready = asyncio.Event()
        # Set, with its reason, once the API server stops waiting for an engine (fail_waiting): it is stopping and
        # none is there.
        self._gave_up = asyncio.Event()
        self._gave_up_reason = ""
        self.card: ModelCard | None = None

    @property
    def is_ready(self) -> bool:
        return self._any_ready.is_set()

    @property
    def in_flight(self) -> int:
        return len(self._in_flight)

    @property
    def restarts_seen(self) -> int:
        return sum(link.restarts_seen for link in self.links)

    def inputs_in_flight(self) -> list[int]:
        """This server's inputs in flight on each engine, in engine order."""
        return list(self._inputs)

    async def connect(self, timeout: float) -> ModelCard:
        """Connect to every engine; each answers Hello with its model card. Serving starts with the first
        to answer (a replacement API server need not wait for an engine that is restarting)."""
        for link in self.links:
            link.start()
        try:
            async with asyncio.timeout(timeout):
                await self._any_ready.wait()
        except TimeoutError:
            endpoints = ", ".join(link.endpoint for link in self.links)
            raise EngineUnavailable(f"no engine answered at {endpoints} within {timeout:.0f}s") from None
        assert self.card is not None
        return self.card

    async def close(self) -> None:
        if self._release_handle is not None:
            self._release_handle.cancel()
        for link in self.links:
            await link.close()
        self._fail_all(EngineUnavailable("the API server is shutting down"))
        self._context.term()

    async def pool(self, request: EngineRequest) -> PooledResult:
        """Send one request (all its inputs in one message) and wait for its rows; its id is assigned here.

        While no engine is ready, a new request waits for one up to `wait_timeout` seconds, or until the API server
        stops waiting (fail_waiting)."""
        # Sent in the loop's next turn, not at once: the requests parsed in one turn then go to the engine back to
        # back, which its I/O thread reads in one wake-up and its scheduler batches together (sent one by one between
        # parses, batches were a quarter smaller and the engine's CPU per request a third higher: docs/benchmarks.md,
        # "CPU per request"). Not yet in flight meanwhile: an engine lost in that turn has nothing of it to move.
        await asyncio.sleep(0)
        if not self._any_ready.is_set():
            await self._until_an_engine_is_ready()
        request_id = request.id = next(self._ids)
        loop = asyncio.get_running_loop()
        entry = InFlight(request, loop.create_future())
        self._in_flight[request_id] = entry
        # Engines whose share of the admission limit was full for this request (engine_core/admission.py).
        refused: set[int] = set()
        try:
            self._route(entry)
            while True:
                if entry.engine is not None:
                    await self._submit(entry)
                try:
                    return await entry.future
                except EngineOverloaded:
                    # Not admitted there: another live engine with room takes it; 429 once every one refused.
                    if entry.engine is None:
                        raise
                    refused.add(entry.engine)
                    entry.engine = None  # _forget has taken its inputs off that engine's count
                    self._route(entry, refused)
                    if entry.engine is None:
                        raise
                    entry.future = loop.create_future()
                    self._in_flight[request_id] = entry
        except asyncio.CancelledError:
            # The caller went away (client disconnect, timeout): the engine need not compute it.
            if self._forget(request_id) is not None and entry.engine is not None:
                await self._abort(entry.engine, request_id)
            raise
        finally:
            self._forget(request_id)

    def latest_pong(self) -> Pong | None:
        """The engines' latest health answers as one: None when no engine answered lately; else the
        queues summed over the engines that did, and the shortest time any of them has been inside one
        forward pass (the server serves while one engine does)."""
        pongs = [pong for pong in (link.latest_pong() for link in self.links) if pong is not None]
        if not pongs:
            return None
        if len(pongs) == 1:
            return pongs[0]
        return Pong(
            -1,
            min(pong.stalled_for for pong in pongs),
            sum(pong.queued_inputs for pong in pongs),
            sum(pong.queued_tokens for pong in pongs),
        )

    def silent_engines(self) -> list[int]:
        if len(self.links) < 2:
            return []
        return [index for index, link in enumerate(self.links) if link.latest_pong() is None]

    def fail_waiting(self, reason: str) -> None:
        """Fail every request in flight now, and every request that waits for an engine now or later while none is
        ready: the API server is stopping, and no engine is there (a drain does not wait for one to be started) or the
        drain is out of time (apiserver/process.py's fail_waiting_on_exit)."""
        self._gave_up_reason = reason
        self._gave_up.set()
        self._fail_all(EngineUnavailable(reason))

    async def _until_an_engine_is_ready(self) -> None:
        """Wait for an engine: EngineUnavailable after `wait_timeout`, or as soon as the API server stops waiting
        (fail_waiting). A request that arrived in a stopping API server after its engine died waited out the whole
        timeout before, and held the drain, and so the supervisor's stop, open that long."""
        if not self._gave_up.is_set():
            ready = asyncio.ensure_future(self._any_ready.wait())
            gave_up = asyncio.ensure_future(self._gave_up.wait())
            try:
                await asyncio.wait((ready, gave_up), timeout=self.wait_timeout, return_when=asyncio.FIRST_COMPLETED)
            finally:
                ready.cancel()
                gave_up.cancel()
        if self._any_ready.is_set():
            return
        if self._gave_up.is_set():
            raise EngineUnavailable(self._gave_up_reason)
        raise EngineUnavailable(f"no engine came back within {self.wait_timeout:g}s")

    # Placing requests ---------------------------------------------------------------------------

    def _route(self, entry: InFlight, refused: AbstractSet[int] = frozenset()) -> None:
        """Put the request on the least-loaded live engine, or leave it waiting (None) when none is live.
        An engine stuck in one forward pass past the stall limit (hung, as /health would say) gets
        nothing new while another engine is not stuck: the supervisor kills it at --worker-timeout.
        Engines in `refused` had no room for it (it is new: not admitted anywhere yet)."""
        if entry.engine is not None:
            self._inputs[entry.engine] -= entry.inputs
        live = [link.is_ready and link.index not in refused for link in self.links]
        flowing = [is_live and not self._is_stuck(link) for is_live, link in zip(live, self.links, strict=True)]
        usable = flowing if any(flowing) else live
        loads = [self._load(index) if ok else None for index, ok in enumerate(usable)]
        entry.engine = self._chooser.pick(loads)
        if entry.engine is not None:
            self._inputs[entry.engine] += entry.inputs

    def _load(self, engine: int) -> int:
        """An engine's inputs waiting or running as this API server sees them: what the engine's latest pong
        counted (every API server's, at most PING_INTERVAL_S old), or this server's own in flight there when
        that is more (it sent some since). Counting only its own, several API servers could all pick the
        engine that is busy with the others' work."""
        own = self._inputs[engine]
        pong = self.links[engine].latest_pong()
        return own if pong is None else max(own, pong.queued_inputs)

    def _is_stuck(self, link: EngineLink) -> bool:
        pong = link.latest_pong()
        return pong is not None and pong.stalled_for > self.stall_limit

    def _forget(self, request_id: int) -> InFlight | None:
        entry = self._in_flight.pop(request_id, None)
        if entry is not None and entry.engine is not None:
            self._inputs[entry.engine] -= entry.inputs
        return entry

    async def _submit(self, entry: InFlight) -> None:
        """Send a request to its engine; one that cannot go now stays in flight. A refused send while
        the engine counts as ready means its death has not reached the socket monitor yet (or the send
        queue is full): retry shortly, unless the disconnect arrives first, which moves the request."""
        engine, attempt = entry.engine, entry.request.attempt
        assert engine is not None
        link = self.links[engine]
        while True:
            try:
                await link.send(self._wire.encode(entry.request))
                return
            except EngineUnavailable:
                await asyncio.sleep(SEND_RETRY_S)
            moved = entry.request.attempt != attempt or entry.engine != engine
            if not link.is_ready or moved or entry.request.id not in self._in_flight:
                return

    async def _abort(self, engine: int, request_id: int) -> None:
        if self.links[engine].is_ready:
            with contextlib.suppress(EngineUnavailable):
                await self.links[engine].send(self._wire.encode(Abort([request_id])))

    async def _resubmit(self, entries: list[InFlight], *, is_suspect: bool, engine: int | None = None) -> None:
        """Send again (bumping `attempt`: admitted already), each to `engine`, or else the least-loaded live one."""
        for entry in entries:
            entry.request.attempt += 1
            entry.request.is_suspect = is_suspect or entry.blames > 0
            if engine is None:
                self._route(entry)
            else:
                entry.engine = engine
                self._inputs[engine] += entry.inputs
            if entry.engine is not None:
                await self._submit(entry)

    # What the links report ----------------------------------------------------------------------

    def on_outputs(self, link: EngineLink, msg: Outputs, rows: list[OutputRows]) -> None:
        for out, vectors in zip(msg.outputs, rows, strict=True):
            entry = self._forget(out.id)
            if entry is not None and not entry.future.done():
                entry.future.set_result(
                    PooledResult(vectors, out.queue_time, out.inference_time, out.cached, out.passes)
                )
        for failure in msg.failures:
            entry = self._forget(failure.id)
            if entry is not None and not entry.future.done():
                overloaded = failure.code == ERROR_OVERLOADED
                entry.future.set_exception((EngineOverloaded if overloaded else EngineError)(failure.message))

    async def on_ready(self, link: EngineLink, ready: Ready) -> None:
        """An engine (a new one, or one restarted) answered the handshake: blame the suspects it names, wherever
        they run now, and send what waits for an engine: the suspects held for this one, each to run alone here."""
        self.card = ready.card
        death = (link.index, self._losses[link.index])
        for request_id in set(ready.suspects) & self._in_flight.keys():
            entry = self._in_flight[request_id]
            engine = entry.engine
            if self._blame(entry, death) and engine is not None:
                await self._abort(engine, request_id)
        link.ready.set()
        self._any_ready.set()
        waiting = [entry for entry in self._in_flight.values() if entry.engine is None and entry.held_for is None]
        held = [entry for entry in self._in_flight.values() if entry.engine is None and entry.held_for == link.index]
        if waiting or held:
            logger.warning(
                "engine %d is ready; resubmitting %d request(s) that were in flight%s",
                link.index,
                len(waiting) + len(held),
                f", {len(held)} of them suspects, each to run alone there" if held else "",
            )
        for entry in held:
            entry.held_for = None
        await self._resubmit(held, is_suspect=True, engine=link.index)
        await self._resubmit(waiting, is_suspect=False)

    async def on_lost(self, link: EngineLink) -> None:
        """An engine went away: the requests its forward pass held wait for its restart (suspects); the rest
        move to the other live engines now, or wait for one."""
        index = link.index
        self._losses[index] += 1
        death = (index, self._losses[index])
        if not any(other.is_ready for other in self.links):
            self._any_ready.clear()
        stranded = [entry for entry in self._in_flight.values() if entry.engine == index]
        for entry in stranded:
            self._inputs[index] -= entry.inputs
            entry.engine = None
        running = self._read_running(index)
        now = asyncio.get_running_loop().time()
        suspects: list[InFlight] = []
        for entry in stranded:
            was_running = running is not None and entry.request.id in running
            if was_running and self._blame(entry, death):
                continue
            # A suspect of an earlier death that had not run yet stays one: it never goes to a healthy engine at once.
            if was_running or entry.blames:
                entry.held_for, entry.held_since = index, now
                suspects.append(entry)
        movable = [entry for entry in stranded if entry.held_for is None and entry.request.id in self._in_flight]
        held = f"; {len(suspects)} suspect(s) (in its forward pass) wait for its restart" if suspects else ""
        if suspects:
            self._schedule_release()
        if not self._any_ready.is_set():
            logger.error("lost the engine; %d request(s) in flight will be resubmitted%s", len(stranded), held)
            return
        logger.error(
            "lost engine %d; moving its %d request(s) in flight to the other engine(s)%s", index, len(movable), held
        )
        # With no record to read, which of them its forward pass held is known only when it is back: each runs
        # alone meanwhile, so that a poison pill among them takes no innocent request with it.
        await self._resubmit(movable, is_suspect=running is None)

    def _read_running(self, engine: int) -> set[int] | None:
        """This server's requests in the dead engine's last forward pass, from its flight record; None when there
        is no record to read. Read at once: the engine's restart rewrites it, seconds later at the earliest."""
        if engine >= len(self.flight_records):
            return None
        record = read_record(self.flight_records[engine])
        if record is None:
            return None
        return set(record.get(self.links[engine].identity, ()))

    def _blame(self, entry: InFlight, death: Death) -> bool:
        """Count a death against the request (once per death); True when that fails it as the cause."""
        entry.blamed_for.add(death)
        if entry.blames < MAX_BLAMES:
            return False
        request_id = entry.request.id
        self._forget(request_id)
        entry.held_for = None
        logger.error("request %d was running when an engine died twice; failing it as the cause", request_id)
        if not entry.future.done():
            entry.future.set_exception(PoisonPill(request_id))
        return True

    def _schedule_release(self) -> None:
        if self._release_handle is None:
            loop = asyncio.get_running_loop()
            self._release_handle = loop.call_later(SUSPECT_CHECK_S, self._release_stranded_suspects)

    def _release_stranded_suspects(self) -> None:
        """Suspects whose engine will not be back soon (taken out of service after a crash loop, or not started
        within `suspect_wait`) go to another engine after all, each alone; with none live, to the first engine
        that answers. Looked at every SUSPECT_CHECK_S while any suspect waits, never otherwise."""
        self._release_handle = None
        now = asyncio.get_running_loop().time()
        held = [entry for entry in self._in_flight.values() if entry.held_for is not None]
        released: list[InFlight] = []
        for entry in held:
            engine = entry.held_for
            assert engine is not None
            is_out = self.is_out_of_service(engine)
            if not is_out and now - entry.held_since < self.suspect_wait:
                continue
            logger.warning(
                "request %d waited %.1fs for engine %d to come back, which is %s; trying it alone elsewhere",
                entry.request.id,
                now - entry.held_since,
                engine,
                "out of service" if is_out else "late",
            )
            entry.held_for = None
            released.append(entry)
        if len(released) < len(held):
            self._schedule_release()
        if released and self._any_ready.is_set():
            task = asyncio.ensure_future(self._resubmit(released, is_suspect=True))
            self._releasing.add(task)
            task.add_done_callback(self._releasing.discard)

    def _fail_all(self, error: Exception) -> None:
        in_flight, self._in_flight = self._in_flight, {}
        self._inputs = [0] * len(self.links)
        for entry in in_flight.values():
            if not entry.future.done():
                entry.future.set_exception(error)
        for link in self.links:
            link.fail_pings(error)
