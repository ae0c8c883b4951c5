"""The supervisor's loop: start the engine and the API servers, watch them, stop them all cleanly.

Signal handlers only queue the signal (gunicorn's arbiter); the loop, woken through
`signal.set_wakeup_fd`, does the dispatching, reaping and logging.
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
import tempfile
import time
from collections import deque
from types import FrameType

import msgspec

from engine_core.config import Config
from supervisor.children import ChildProcess, spawn_child
from supervisor.sockets import bind_socket, bound_port

logger = logging.getLogger("poolserve.supervisor")

EXIT_OK = 0
EXIT_CHILD_DIED = 1
EXIT_START_FAILED = 3

API_SERVER_BOOT_TIMEOUT_S = 60.0
ENGINE_STOP_TIMEOUT_S = 10.0
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class StartFailed(Exception):
    """A child could not boot; the message is the one line the operator sees."""


class StopRequested(Exception):
    pass


class Supervisor:
    def __init__(self, config: Config):
        self.config = config
        self.engine: ChildProcess | None = None
        self.api_servers: list[ChildProcess] = []
        self.listener: socket.socket | None = None
        self.runtime_dir = ""
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
        handled = (*STOP_SIGNALS, signal.SIGCHLD)
        previous = {signum: signal.signal(signum, self.handle_signal) for signum in handled}
        try:
            self.start()
            return self.watch()
        except StopRequested:
            logger.info("stop requested during start-up")
            return EXIT_OK
        except StartFailed as exc:
            print(f"poolserve: could not start: {exc}", file=sys.stderr, flush=True)
            return EXIT_START_FAILED
        finally:
            self.stop()
            for signum, handler in previous.items():
                signal.signal(signum, handler)
            signal.set_wakeup_fd(previous_wakeup_fd)
            self._selector.close()
            os.close(self._wakeup_r)
            os.close(self._wakeup_w)

    def start(self) -> None:
        config = self.config
        started = time.perf_counter()
        self.runtime_dir = tempfile.mkdtemp(prefix="poolserve-")  # mode 0700
        try:
            self.listener = bind_socket(config.host, config.port)
        except OSError as exc:
            raise StartFailed(f"cannot listen on {config.host}:{config.port}: {exc.strerror or exc}") from exc
        # The engine has no use for the API key: one process fewer holds it.
        self.engine = spawn_child("engine", msgspec.structs.replace(config, api_key=""), self.runtime_dir)
        engine_report = self.wait_for_boot([self.engine], config.engine_start_timeout)
        self.api_servers = [
            spawn_child("api", config, self.runtime_dir, index=i, listener=self.listener)
            for i in range(config.api_server_count)
        ]
        self.wait_for_boot(self.api_servers, API_SERVER_BOOT_TIMEOUT_S)
        if config.binds_beyond_loopback and not config.api_key:
            logger.warning("listening on %s without an API key: anyone who can reach the port can use it", config.host)
        print(ready_line(config, bound_port(self.listener), time.perf_counter() - started, engine_report), flush=True)

    def wait_for_boot(self, children: list[ChildProcess], timeout: float) -> str:
        """Wait until every child reports ready; returns the last ready report's message."""
        deadline = time.monotonic() + timeout
        waiting = {child.boot_fd: child for child in children}
        for fd in waiting:
            self._selector.register(fd, selectors.EVENT_READ)
        message = ""
        try:
            while waiting:
                self._dispatch_signals()
                for fd, child in list(waiting.items()):
                    report = child.read_boot_report()
                    code = child.poll()
                    if report is not None and report.status == "ready":
                        message = report.message
                        del waiting[fd]
                        self._selector.unregister(fd)
                        child.close_boot_pipe()
                    elif report is not None:
                        raise StartFailed(f"{child.name} failed: {report.message}")
                    elif code is not None:
                        raise StartFailed(f"{child.name} (pid {child.pid}) exited with code {code} while starting")
                remaining = deadline - time.monotonic()
                if waiting and remaining <= 0:
                    names = ", ".join(child.name for child in waiting.values())
                    raise StartFailed(f"{names} not ready after {timeout:.0f}s")
                if waiting:
                    self._wait(min(remaining, 0.5))
        finally:
            for fd in waiting:
                self._selector.unregister(fd)
        return message

    def watch(self) -> int:
        """Serve until a stop signal (exit 0) or a child's death (exit 1)."""
        while True:
            try:
                self._dispatch_signals()
            except StopRequested:
                return EXIT_OK
            for child in self.children:
                code = child.poll()
                if code is not None:
                    logger.error("%s (pid %d) exited with code %s; stopping poolserve", child.name, child.pid, code)
                    return EXIT_CHILD_DIED
            self._wait(1.0)

    @property
    def children(self) -> list[ChildProcess]:
        return ([self.engine] if self.engine else []) + self.api_servers

    def stop(self) -> None:
        """API servers first (they drain in-flight requests, which need the engine), then the engine."""
        self._stop_group(self.api_servers, self.config.shutdown_timeout + 5)
        if self.engine is not None:
            self._stop_group([self.engine], ENGINE_STOP_TIMEOUT_S)
        for child in self.children:
            child.close_boot_pipe()
        if self.listener is not None:
            self.listener.close()
        if self.runtime_dir:
            shutil.rmtree(self.runtime_dir, ignore_errors=True)

    def _stop_group(self, children: list[ChildProcess], timeout: float) -> None:
        for child in children:
            child.send_signal(signal.SIGTERM)
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

    def _dispatch_signals(self) -> None:
        for signum in self._take_signals():
            if signum in STOP_SIGNALS:
                logger.info("received %s; shutting down", signal.Signals(signum).name)
                raise StopRequested

    def _wait(self, timeout: float) -> None:
        """Sleep until a signal, a boot report, or the timeout."""
        for key, _ in self._selector.select(timeout):
            if key.fd == self._wakeup_r:
                with contextlib.suppress(BlockingIOError):
                    os.read(self._wakeup_r, 4096)


def ready_line(config: Config, port: int, seconds: float, engine_report: str) -> str:
    """The one line that says the server is up, where, and who may reach it."""
    reach = " (listening beyond loopback: reachable from other machines)" if config.binds_beyond_loopback else ""
    key = ", API key required" if config.api_key else ""
    return (
        f"poolserve ready in {seconds:.1f}s on http://{config.host}:{port}{reach}: "
        f"model {config.model_names[0]} ({engine_report}), {config.api_server_count} API server(s){key}"
    )
