"""The supervisor's loop: start the engine and the API servers, keep them alive, stop them cleanly.

Signal handlers only queue the signal (gunicorn's arbiter); one loop, woken by
`signal.set_wakeup_fd` and by the children's pipes, reads boot reports and heartbeats, reaps
and restarts children (backing off when one crash-loops, giving up past a limit), kills the
ones whose heartbeat went silent, and carries out rolling restarts and scaling.
"""

from __future__ import annotations

import contextlib
import logging
import os
import selectors
import shutil
import signal
import socket
import sys
import time
from collections import defaultdict, deque
from collections.abc import Mapping, Sequence
from types import FrameType, ModuleType

import msgspec

from poolserve.boot import EXIT_BOOT_ERROR, EngineLayout, Role, child_name, describe_exit
from poolserve.config import Config
from poolserve.load_board import LoadBoard, SlotState, Word
from supervisor.children import CHILD_PROGRAMS, CUDA_DEVICES_ENV, ChildProcess, gpu_names, spawn_child
from supervisor.engine_template import EngineTemplate, become_subreaper, reap_strays
from supervisor.gpu_placement import PlacedModel, PlacementError, place_engines
from supervisor.restart_policy import GiveUp, Others, RestartPolicy, TakeOutOfService
from supervisor.runtime_dir import create_runtime_dir, remove_stale_runtime_dirs, room_shortfall
from supervisor.sockets import bind_socket, bound_port

logger = logging.getLogger("poolserve.supervisor")

EXIT_OK = 0
EXIT_GAVE_UP = 1
EXIT_START_FAILED = 3

# An API server's boot waits for the engine, which may itself be restarting.
API_SERVER_BOOT_EXTRA_S = 60.0
ENGINE_STOP_TIMEOUT_S = 10.0
# Stopping: how long to wait for the API servers to stop accepting before the listening socket is shut
# under them (_stop_listening); one whose event loop is blocked never says it has.
STOP_ACCEPTING_WAIT_S = 2.0
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
METRICS_DIR_ENV = "PROMETHEUS_MULTIPROC_DIR"
HANDLED_SIGNALS = (*STOP_SIGNALS, signal.SIGHUP, signal.SIGTTIN, signal.SIGTTOU, signal.SIGCHLD)


class StartFailed(Exception):
    """A child could not boot; the message is the one line the operator sees. Halts at once."""


class GaveUp(Exception):
    """A child keeps crashing; the message says which and how often."""


class StopRequested(Exception):
    pass


class Supervisor:
    def __init__(
        self,
        config: Config,
        models: Sequence[Config] = (),
        *,
        programs: Mapping[Role, Sequence[str]] = CHILD_PROGRAMS,
        restart_policy: RestartPolicy | None = None,
    ):
        """`models`: every model's Config, `config` (the default model's) first, when it serves several
        (poolserve/served_models.py); their server-wide settings are `config`'s. `programs`: the command line each
        role's children run (supervisor/children.py); `restart_policy`: what a crash leads to."""
        self.config = config
        self.models = list(models) or [config]
        self.layout = EngineLayout([model.engine_count for model in self.models])
        self.api_server_count = config.api_server_count
        # The engine of each index (each model's --engine-count, numbered across the models: EngineLayout); one
        # that died is absent until its restart.
        self.engines: dict[int, ChildProcess] = {}
        total = self.layout.total
        self.engine_slots = {child_name("engine", i, total): i for i in range(total)}
        # The serving (or booting) API server of each index.
        self.api_servers: dict[int, ChildProcess] = {}
        # SIGHUP: the new process of an index, booting while the old one still serves.
        self.replacements: dict[int, ChildProcess] = {}
        # Told to stop and draining (SIGHUP, SIGTTOU).
        self.retiring: list[ChildProcess] = []
        self.rolling: deque[int] = deque()
        self.respawn_at: dict[str, float] = {}
        self.programs = programs
        self.restart_policy = restart_policy or RestartPolicy()
        # Each child's crash times (monotonic) that still count: the restart policy's input.
        self.crashes: dict[str, list[float]] = defaultdict(list)
        self.listener: socket.socket | None = None
        # What each API server holds, read by its siblings' fair accept (apiserver/connection/fair_accept.py).
        self.board: LoadBoard | None = None
        self.runtime_dir = ""
        # Each engine's CUDA_VISIBLE_DEVICES (None: the supervisor's), decided at start (supervisor/gpu_placement.py).
        self.engine_gpus: list[str | None] = [None] * self.layout.total
        self.visible_gpus: list[str] = []
        # Where engines on the CPU are forked from (supervisor/engine_template.py); None: every engine starts fresh.
        self.template: EngineTemplate | None = None
        self._announced: set[int] = set()
        self.metrics: ModuleType
        self._signals: deque[int] = deque()
        self._selector = selectors.DefaultSelector()
        self._wakeup_r, self._wakeup_w = os.pipe()

    def handle_signal(self, signum: int, frame: FrameType | None) -> None:
        self._signals.append(signum)

    def run(self) -> int:
        for fd in (self._wakeup_r, self._wakeup_w):
            os.set_blocking(fd, False)
        self._selector.register(self._wakeup_r, selectors.EVENT_READ)
        previous_wakeup_fd = signal.set_wakeup_fd(self._wakeup_w)
        previous = {signum: signal.signal(signum, self.handle_signal) for signum in HANDLED_SIGNALS}
        try:
            self.start()
            return self.watch()
        except StopRequested:
            logger.info("stop requested")
            return EXIT_OK
        except StartFailed as exc:
            print(f"poolserve: could not start: {exc}", file=sys.stderr, flush=True)
            return EXIT_START_FAILED
        except GaveUp as exc:
            print(f"poolserve: giving up: {exc}", file=sys.stderr, flush=True)
            return EXIT_GAVE_UP
        finally:
            self.stop()
            for signum, handler in previous.items():
                signal.signal(signum, handler)
            signal.set_wakeup_fd(previous_wakeup_fd)
            self._selector.close()
            os.close(self._wakeup_r)
            os.close(self._wakeup_w)

    # Start-up ----------------------------------------------------------------------------------

    def start(self) -> None:
        config = self.config
        started = time.perf_counter()
        placed = [
            PlacedModel(model.model_names[0], model.device_kind, model.gpu_indexes, model.engine_count)
            for model in self.models
        ]
        self.visible_gpus = gpu_names(os.environ.get(CUDA_DEVICES_ENV))
        try:
            placement = place_engines(placed, self.visible_gpus)
        except PlacementError as exc:
            raise StartFailed(str(exc)) from None
        self.engine_gpus = placement.gpus
        for warning in placement.warnings:
            logger.warning("%s", warning)
        try:
            remove_stale_runtime_dirs()  # what a supervisor killed with SIGKILL could not remove
            self.runtime_dir = create_runtime_dir()
        except OSError as exc:  # tempfile finds no usable folder, or this one has no room
            where = f" {exc.filename}" if exc.filename else ""
            raise StartFailed(
                f"cannot create the runtime folder{where}: {exc.strerror or exc} (TMPDIR names where it goes)"
            ) from exc
        # Not a reason to refuse: with no room at all the server serves, and only metrics miss series.
        shortfall = room_shortfall(self.runtime_dir, self.api_server_count + self.layout.total + 1)
        if shortfall:
            logger.warning(
                "%s: /metrics will miss series (counted in poolserve_metric_series_dropped_total)", shortfall
            )
        self._prepare_metrics()
        try:
            self.listener = bind_socket(config.host, config.port)
        except OSError as exc:
            raise StartFailed(f"cannot listen on {config.host}:{config.port}: {exc.strerror or exc}") from exc
        self.board = LoadBoard.create()
        self._start_template()
        # All at once: each loads its own copy of the model, and start-up waits for the slowest.
        for index in range(self.layout.total):
            self.engines[index] = self._spawn("engine", index)
        self._await_ready(list(self.engines.values()), config.engine_start_timeout)
        for index in range(self.api_server_count):
            self.api_servers[index] = self._spawn("api", index)
        self._await_ready(list(self.api_servers.values()), config.engine_start_timeout + API_SERVER_BOOT_EXTRA_S)
        self._announced.update(child.pid for child in self.children)
        if config.binds_beyond_loopback and not config.api_key:
            logger.warning("listening on %s without an API key: anyone who can reach the port can use it", config.host)
        reports = []
        for model in range(len(self.models)):
            first = self.engines[self.layout.engines_of(model).start].boot_report
            reports.append(first.message if first else "")
        seconds = time.perf_counter() - started
        print(ready_line(config, bound_port(self.listener), seconds, reports[0], self._others(reports)), flush=True)

    def _runs_on_cpu(self, engine_index: int) -> bool:
        device = self._model_of(engine_index).device_kind
        return device == "cpu" or (device == "auto" and not self.visible_gpus)

    def _start_template(self) -> None:
        """The engine template, where some engine runs on the CPU and runs `python -m engine_core` (not a program
        given in its stead), waited for: the first engines are forked from it. Where it cannot be had they start
        fresh, at the same cost as without one."""
        if self.programs["engine"] != CHILD_PROGRAMS["engine"]:
            return
        if not any(self._runs_on_cpu(index) for index in range(self.layout.total)):
            return
        if not become_subreaper():
            logger.info("engines start as fresh interpreters: this system cannot hand them to the supervisor")
            return
        self.template = EngineTemplate(self.config)
        self.template.start()
        deadline = time.monotonic() + self.config.engine_start_timeout
        while self.template.is_importing and time.monotonic() < deadline:
            self.template.wait_ready(0.1)
            self._dispatch_signals()  # a stop asked for meanwhile is not kept waiting for the imports

    def _prepare_metrics(self) -> None:
        """Every process writes its series here; any API server's /metrics reads them all. Set before
        anything imports prometheus_client, which picks its storage then; children inherit it."""
        directory = os.path.join(self.runtime_dir, "metrics")
        os.mkdir(directory, 0o700)
        os.environ[METRICS_DIR_ENV] = directory
        from poolserve.metric_files import reserve_metric_files

        reserve_metric_files()
        from supervisor import metrics

        for process in ("engine", "api_server"):
            metrics.RESTARTS.labels(process=process)  # a series at 0 from the start, as Prometheus advises
        self.metrics = metrics

    def _reap_strays(self) -> None:
        """With the engine template, this process is a subreaper: what it is handed and does not manage is stopped
        (an engine) and reaped (supervisor/engine_template.py); an engine's metric series go with it."""
        if self.template is None:
            return
        for pid in reap_strays({child.pid for child in self.children} | {self.template.pid}):
            self.metrics.mark_process_dead(pid)
            self._fold_metric_files(pid)

    def _fold_metric_files(self, pid: int) -> None:
        directory = os.environ.get(METRICS_DIR_ENV)
        if not directory:
            return
        from poolserve.metric_archive import fold_dead_files

        try:
            fold_dead_files(directory, pid)
        except OSError as exc:  # the metrics are the operator's view; a fold that fails must not stop serving
            logger.warning("metrics: could not fold the files of dead pid %d: %s", pid, exc)

    def _await_ready(self, children: list[ChildProcess], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not all(child.is_ready for child in children):
            self._wait(0.5)
            self._read_pipes()
            self._dispatch_signals()
            self._reap_strays()
            for child in children:
                if child.has_failed_boot:
                    raise StartFailed(f"{child.name} failed: {child.boot_report.message}")  # type: ignore[union-attr]
                code = child.poll()
                if code is not None and not child.is_ready:
                    raise StartFailed(f"{child.name} (pid {child.pid}) {describe_exit(code)} while starting")
            if time.monotonic() > deadline:
                names = ", ".join(child.name for child in children if not child.is_ready)
                raise StartFailed(f"{names} not ready after {timeout:.0f}s")

    # The loop ----------------------------------------------------------------------------------

    def watch(self) -> int:
        while True:
            self._wait(self._seconds_to_next_event())
            self._read_pipes()
            try:
                self._dispatch_signals()
            except StopRequested:
                return EXIT_OK
            self._reap()
            if self.template is not None:
                self.template.poll()
                self._reap_strays()
            self._check_liveness()
            self._spawn_due()
            self._advance_rolling_restart()
            self._announce_ready()
            serving = [c for c in self.api_servers.values() if c.is_ready and not c.is_stopping]
            self.metrics.API_SERVERS.set(len(serving))

    @property
    def children(self) -> list[ChildProcess]:
        return (
            list(self.engines.values())
            + list(self.api_servers.values())
            + list(self.replacements.values())
            + self.retiring
        )

    @property
    def _engine_counts(self) -> list[int] | None:
        """Each model's engine count for the children's specs, with several models (one: the spec's own config)."""
        return self.layout.counts if len(self.models) > 1 else None

    def _seconds_to_next_event(self) -> float:
        now = time.monotonic()
        due = [when - now for when in self.respawn_at.values()]
        return max(0.0, min([1.0, *due]))

    def _read_pipes(self) -> None:
        for child in self.children:
            if child.pipe_fd >= 0 and not child.read_pipe():
                self._selector.unregister(child.pipe_fd)
                child.close_pipe()

    def _dispatch_signals(self) -> None:
        for signum in self._take_signals():
            if signum in STOP_SIGNALS:
                logger.info("received %s; shutting down", signal.Signals(signum).name)
                raise StopRequested
            if signum == signal.SIGHUP:
                self.rolling = deque(sorted(self.api_servers))
                logger.info("SIGHUP: restarting %d API server(s) one by one", len(self.rolling))
            elif signum == signal.SIGTTIN:
                self._scale_up()
            elif signum == signal.SIGTTOU:
                self._scale_down()

    def _scale_up(self) -> None:
        ceiling = self.config.api_server_ceiling
        if self.api_server_count >= ceiling:
            logger.warning("SIGTTIN ignored: %d API servers is the maximum (--max-api-server-count)", ceiling)
            return
        self.api_server_count += 1
        logger.info("SIGTTIN: scaling up to %d API server(s)", self.api_server_count)

    def _scale_down(self) -> None:
        if self.api_server_count <= 1:
            logger.warning("SIGTTOU ignored: 1 API server is the minimum")
            return
        self.api_server_count -= 1
        index = self.api_server_count
        logger.info("SIGTTOU: scaling down to %d API server(s); api-%d drains and stops", self.api_server_count, index)
        self.respawn_at.pop(f"api-{index}", None)
        with contextlib.suppress(ValueError):
            self.rolling.remove(index)
        for child in (self.api_servers.pop(index, None), self.replacements.pop(index, None)):
            if child is not None:
                self._retire(child)

    def _retire(self, child: ChildProcess) -> None:
        child.stop()
        self.retiring.append(child)

    def _reap(self) -> None:
        now = time.monotonic()
        for child in self.children:
            code = child.poll()
            if code is None:
                continue
            self._forget(child)
            # Its live gauges stop counting; its counters and histograms stay in the totals, folded into the
            # archive files so the folder (and each scrape's work) does not grow with every restart.
            self.metrics.mark_process_dead(child.pid)
            self._fold_metric_files(child.pid)
            if child.is_stopping:
                logger.info("%s (pid %d) stopped", child.name, child.pid)
                continue
            if child.has_failed_boot or code == EXIT_BOOT_ERROR:
                message = child.boot_report.message if child.boot_report else "see its log above"
                raise StartFailed(f"{child.name} failed to start again: {message}")
            history = self.restart_policy.recent([*self.crashes[child.name], now], now)
            self.crashes[child.name] = history
            others = self._others_serving(child) if child.role == "engine" else Others.NONE
            decision = self.restart_policy.decide(history, now, is_engine=child.role == "engine", others=others)
            if isinstance(decision, TakeOutOfService):
                # Its model's other engines serve; or, its model's last, the other models do (issue 30: one model's
                # crash loop never stops another's service).
                if decision.others is Others.OWN_MODEL:
                    meanwhile = "while the other engines serve"
                else:
                    model = self._model_of(child.index).model_names[0]
                    meanwhile = f"model {model} is unavailable meanwhile; the other models serve on"
                self._take_out_of_service(child, decision, code, now, meanwhile)
                continue
            if isinstance(decision, GiveUp):
                raise GaveUp(
                    f"{child.name} stopped unexpectedly {decision.crashes} times within "
                    f"{self.restart_policy.window:.0f}s (last: pid {child.pid} {describe_exit(code)})"
                )
            delay, crashes = decision
            consequence = ""
            if child.role == "engine":
                consequence = (
                    "; the API servers move what it had queued to the other engines and keep what it was running "
                    "for its restart"
                    if self._model_of(child.index).engine_count > 1
                    else "; the API servers keep what was in flight and resubmit it"
                )
                if len(self.models) > 1:
                    consequence += f" (model {self._model_of(child.index).model_names[0]}; the other models serve on)"
            logger.error(
                "%s (pid %d) %s; restarting it%s%s",
                child.name,
                child.pid,
                describe_exit(code),
                f" in {delay:.1f}s (crash {crashes} within {self.restart_policy.window:.0f}s)" if delay else "",
                consequence,
            )
            if child.role == "api" and child.index in self.rolling:
                self.rolling.remove(child.index)
            self.respawn_at[child.name] = now + delay
            self.metrics.RESTARTS.labels(process="engine" if child.role == "engine" else "api_server").inc()

    def _others_serving(self, engine: ChildProcess) -> Others:
        """Who is up (started, not out of service) to serve while this engine cannot: another engine of its own
        model, else one of another model's."""
        own = self.layout.engines_of(self.layout.model_of(engine.index))
        up = [other for other in self.engines.values() if other is not engine and other.poll() is None]
        if any(other.index in own for other in up):
            return Others.OWN_MODEL
        return Others.OTHER_MODELS if up else Others.NONE

    def _model_of(self, engine_index: int) -> Config:
        return self.models[self.layout.model_of(engine_index)]

    def _others(self, reports: list[str]) -> list[tuple[Config, str]]:
        """The models after the default, each with its first engine's boot report (the ready line names them)."""
        return list(zip(self.models[1:], reports[1:], strict=True))

    def _take_out_of_service(
        self, child: ChildProcess, decision: TakeOutOfService, code: int, now: float, meanwhile: str
    ) -> None:
        """A crash-looping engine beside others that serve: it alone stops, for the policy's time, then gets a fresh
        start; the API servers send it nothing meanwhile (no link answers), so the service goes on."""
        logger.error(
            "%s (pid %d) %s: %d crashes within %.0fs; taken out of service for %.0fs %s",
            child.name, child.pid, describe_exit(code), decision.crashes, self.restart_policy.window,
            decision.seconds, meanwhile,
        )  # fmt: skip
        self.crashes[child.name] = []
        self.respawn_at[child.name] = now + decision.seconds
        # The `engine` label the engines' own series carry: the engine's index ("1" for engine-1).
        self.metrics.ENGINES_OUT_OF_SERVICE.labels(
            engine=str(child.index), model=self._model_of(child.index).model_names[0]
        ).set(1)
        if self.board is not None:  # the API servers stop keeping its suspects for a restart that is minutes away
            self.board.set_engine_out_of_service(self.engine_slots[child.name], True)

    def _forget(self, child: ChildProcess) -> None:
        if child.pipe_fd >= 0:
            self._selector.unregister(child.pipe_fd)
            child.close_pipe()
        if child.board_slot and self.board is not None:
            # Its connections died with it: the siblings' fair shares change at once.
            self.board.release_slot(child.board_slot)
            child.board_slot = 0
        if child.role == "engine":
            if self.engines.get(child.index) is child:
                del self.engines[child.index]
        elif self.api_servers.get(child.index) is child:
            del self.api_servers[child.index]
        elif self.replacements.get(child.index) is child:
            del self.replacements[child.index]
        elif child in self.retiring:
            self.retiring.remove(child)

    def _check_liveness(self) -> None:
        """Kill what stopped beating, what boots too long, and what drains too long."""
        now = time.monotonic()
        config = self.config
        for child in self.children:
            if child.stopped_at is not None:
                if now - child.stopped_at > config.shutdown_timeout + 5 and child.poll() is None:
                    logger.warning("%s (pid %d) did not finish draining in time; killing it", child.name, child.pid)
                    child.kill()
            elif not child.is_ready:
                limit = config.engine_start_timeout + (API_SERVER_BOOT_EXTRA_S if child.role == "api" else 0)
                if now - child.started_at > limit:
                    child.kill()
                    raise StartFailed(f"{child.name} (pid {child.pid}) not ready after {limit:.0f}s")
            elif config.worker_timeout and now - child.last_beat > config.worker_timeout and child.poll() is None:
                logger.error(
                    "%s (pid %d) sent no heartbeat for %.0fs (--worker-timeout %g): it is hung; killing it",
                    child.name,
                    child.pid,
                    now - child.last_beat,
                    config.worker_timeout,
                )
                child.kill()
                child.last_beat = now  # one kill and one log line; the reap follows

    def _spawn_due(self) -> None:
        now = time.monotonic()
        for slot, when in list(self.respawn_at.items()):
            if when > now:
                continue
            del self.respawn_at[slot]
            if slot in self.engine_slots:
                index = self.engine_slots[slot]
                self.engines[index] = self._spawn("engine", index)
                model = self._model_of(index).model_names[0]
                self.metrics.ENGINES_OUT_OF_SERVICE.labels(engine=str(index), model=model).set(0)
                if self.board is not None:
                    self.board.set_engine_out_of_service(index, False)
        for index in range(self.api_server_count):
            if index not in self.api_servers and f"api-{index}" not in self.respawn_at:
                self.api_servers[index] = self._spawn("api", index)

    def _advance_rolling_restart(self) -> None:
        for index, new in list(self.replacements.items()):
            if new.is_ready:
                del self.replacements[index]
                old = self.api_servers.get(index)
                self.api_servers[index] = new
                if old is not None:
                    logger.info("api-%d: pid %d is ready; pid %d drains and stops", index, new.pid, old.pid)
                    self._retire(old)
        if not self.replacements and self.rolling:
            index = self.rolling.popleft()
            if index in self.api_servers:
                self.replacements[index] = self._spawn("api", index)
            if not self.rolling:
                logger.info("SIGHUP: the last API server is being replaced")

    def _announce_ready(self) -> None:
        for child in self.children:
            if child.is_ready and child.pid not in self._announced:
                self._announced.add(child.pid)
                forked = f", forked from engine-template (pid {child.forked_by})" if child.forked_by else ""
                logger.info("%s (pid %d) is ready%s", child.name, child.pid, forked)

    def _spawn(self, role: str, index: int = 0) -> ChildProcess:
        if role == "engine":
            # The engine has no use for the API key: one process fewer holds it. --protect-metrics goes with
            # it, since the copy is validated again and a protected /metrics without a key is refused.
            model = self.models[self.layout.model_of(index)]
            keyless = msgspec.structs.replace(
                model, api_key="", protect_metrics=False, torch_threads=model.engine_torch_threads
            )
            child = spawn_child(
                "engine",
                keyless,
                self.runtime_dir,
                index=index,
                engine_counts=self._engine_counts,
                gpu=self.engine_gpus[index],
                program=self.programs["engine"],
                template=self.template if self._runs_on_cpu(index) else None,
            )
        else:
            child = spawn_child(
                "api",
                self.config,
                self.runtime_dir,
                index=index,
                listener=self.listener,
                board=self.board,
                models=self.models if len(self.models) > 1 else None,
                engine_counts=self._engine_counts,
                program=self.programs["api"],
            )
        self._selector.register(child.pipe_fd, selectors.EVENT_READ)
        return child

    # Stopping ----------------------------------------------------------------------------------

    def stop(self) -> None:
        """API servers first (they drain in-flight requests, which need the engine), then the engine."""
        api_servers = list(self.api_servers.values()) + list(self.replacements.values()) + self.retiring
        for child in api_servers:
            child.stop()
        self._stop_listening(api_servers)
        self._await_exit(api_servers, self.config.shutdown_timeout + 5)
        engines = list(self.engines.values())
        self._stop_group(engines, ENGINE_STOP_TIMEOUT_S)
        if self.template is not None:
            self.template.stop()
        for child in [*api_servers, *engines]:
            if child.pipe_fd >= 0:
                with contextlib.suppress(KeyError, ValueError):
                    self._selector.unregister(child.pipe_fd)
                child.close_pipe()
        if self.listener is not None:
            self.listener.close()
        if self.board is not None:
            self.board.close()
            self.board = None
        if self.runtime_dir:
            shutil.rmtree(self.runtime_dir, ignore_errors=True)

    def _stop_listening(self, api_servers: list[ChildProcess]) -> None:
        """Once the API servers have stopped accepting, shut the listening socket itself. Their copies and
        this process's would keep it listening through the drain: the kernel would take new connections that
        nobody accepts, and a client or a proxy would wait on each until the supervisor exits and it is
        reset. Shut, it refuses them at once (on Linux, shutdown() on a listening socket stops it for every
        process that holds it), and a balancer in front sends them to another instance."""
        if self.listener is None or self.board is None:
            return
        board = self.board

        def accepting() -> bool:
            return any(
                child.poll() is None
                and child.board_slot
                and board.read(child.board_slot, Word.STATE) == SlotState.ACCEPTING
                for child in api_servers
            )

        deadline = time.monotonic() + STOP_ACCEPTING_WAIT_S
        while accepting() and time.monotonic() < deadline:
            self._wait(0.01)
        with contextlib.suppress(OSError):
            self.listener.shutdown(socket.SHUT_RDWR)

    def _stop_group(self, children: list[ChildProcess], timeout: float) -> None:
        for child in children:
            child.stop()
        self._await_exit(children, timeout)

    def _await_exit(self, children: list[ChildProcess], timeout: float) -> None:
        """Wait for children told to stop; kill what is left at the timeout or on a second SIGINT."""
        deadline = time.monotonic() + timeout
        while any(child.poll() is None for child in children) and time.monotonic() < deadline:
            if signal.SIGINT in self._take_signals():
                logger.warning("second interrupt: stopping at once")
                break
            self._wait(0.1)
        for child in children:
            if child.poll() is None:
                logger.warning("%s (pid %d) did not stop in time; killing it", child.name, child.pid)
                child.kill()
                child.popen.wait()

    def _take_signals(self) -> list[int]:
        taken = list(self._signals)
        self._signals.clear()
        return taken

    def _wait(self, timeout: float) -> None:
        """Sleep until a signal, a child's pipe has something, or the timeout."""
        with contextlib.suppress(OSError, ValueError):
            for key, _ in self._selector.select(timeout):
                if key.fd == self._wakeup_r:
                    with contextlib.suppress(BlockingIOError):
                        os.read(self._wakeup_r, 4096)


def ready_line(
    config: Config, port: int, seconds: float, engine_report: str, others: Sequence[tuple[Config, str]] = ()
) -> str:
    """The one line that says the server is up, where, and who may reach it; `others`: the models served beside
    the default one, each with its first engine's report."""
    reach = " (listening beyond loopback: reachable from other machines)" if config.binds_beyond_loopback else ""
    key = ", API key required" if config.api_key else ""
    if others:  # each model with its own engine count; the first is the default
        described = [f"model {config.model_names[0]} (the default: {engine_report}{engines_of(config)})"]
        described += [f"model {model.model_names[0]} ({report}{engines_of(model)})" for model, report in others]
        models, engines = ", ".join(described), ""
    else:
        models, engines = f"model {config.model_names[0]} ({engine_report})", engines_of(config)
    return (
        f"poolserve ready in {seconds:.1f}s on http://{config.host}:{port}{reach}: "
        f"{models}, {config.api_server_count} API server(s){engines}{key}"
    )


def engines_of(config: Config) -> str:
    return f", {config.engine_count} engines" if config.engine_count > 1 else ""
