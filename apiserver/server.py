"""One API-server process: handshake with the engine, then serve HTTP on the shared socket."""

from __future__ import annotations

import asyncio
import gc
import logging
import signal
import socket
import time
from types import FrameType

import uvicorn
import uvloop

from apiserver.app import build_app
from apiserver.fair_accept import ServerLoad
from apiserver.fetch_guard import FetchPolicy
from apiserver.http_protocol import ConnectionPolicy
from apiserver.http_server import GatedServer
from apiserver.inputs.image_sources import ImageLoader
from apiserver.media import MediaFetcher
from apiserver.metrics import sample_loop_lag
from apiserver.plugins import PluginError, load_plugins
from apiserver.preprocess import Preprocessor
from apiserver.state import AppState
from apiserver.tokenizer import TextTokenizer
from engine_client import EngineClient, EngineUnavailable
from poolserve.boot import (
    EXIT_BOOT_ERROR,
    BootReport,
    ChildSpec,
    report_boot,
    send_heartbeat,
)
from poolserve.load_board import LoadBoard
from poolserve.logs import configure_logging

logger = logging.getLogger("poolserve.api")

HEARTBEAT_INTERVAL_S = 1.0


class ExitRequest:
    """Records SIGTERM/SIGINT that arrive before uvicorn takes the signals over, and hands them on."""

    def __init__(self) -> None:
        self.is_requested = False
        self.server: uvicorn.Server | None = None

    def handle_term(self, signum: int, frame: FrameType | None) -> None:
        self.is_requested = True
        if self.server is not None:
            self.server.should_exit = True


async def beat(spec: ChildSpec) -> None:
    """The heartbeat comes from the event loop itself: a blocked loop stops it, and the supervisor
    replaces this process after --worker-timeout."""
    while True:
        send_heartbeat(spec)
        await asyncio.sleep(HEARTBEAT_INTERVAL_S)


async def fail_waiting_on_exit(server: uvicorn.Server, engine: EngineClient) -> None:
    """Once asked to stop, requests waiting for an engine that is not there get their 503 now,
    instead of holding the drain open until --shutdown-timeout."""
    while not server.should_exit:
        await asyncio.sleep(0.1)
    while True:
        if not engine.is_ready:
            engine.fail_waiting("the API server is stopping and no engine is running")
        await asyncio.sleep(0.1)


def run(spec: ChildSpec) -> int:
    configure_logging(spec.name, spec.config.log_level, spec.config.log_format)
    exit_request = ExitRequest()
    # uvicorn re-raises the signal that stopped it once it restores these handlers; ours then
    # only records it, and the process exits 0.
    signal.signal(signal.SIGTERM, exit_request.handle_term)
    signal.signal(signal.SIGINT, exit_request.handle_term)
    listener = socket.socket(fileno=spec.listen_fd)
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(serve(spec, listener, exit_request))


async def serve(spec: ChildSpec, listener: socket.socket, exit_request: ExitRequest) -> int:
    config = spec.config
    try:
        plugins = load_plugins(config.plugins)
    except PluginError as exc:
        report_boot(spec, BootReport(status="failed", message=f"API server {spec.index}: {exc}"))
        return EXIT_BOOT_ERROR
    engine = EngineClient(
        spec.engine_endpoints,
        spec.index,
        wait_timeout=config.engine_wait_timeout,
        stall_limit=config.engine_stall_limit,
    )
    # A replacement API server may start while the engine itself restarts: wait as long as an engine
    # boot, but stop waiting at once when told to stop.
    connecting = asyncio.create_task(engine.connect(config.engine_start_timeout))
    while not connecting.done() and not exit_request.is_requested:
        await asyncio.wait({connecting}, timeout=0.1)
    if not connecting.done():
        connecting.cancel()
        await engine.close()
        return 0
    try:
        card = connecting.result()
    except (EngineUnavailable, TimeoutError) as exc:
        report_boot(
            spec,
            BootReport(status="failed", message=f"API server {spec.index} cannot reach the engine: {exc}"),
        )
        await engine.close()
        return EXIT_BOOT_ERROR
    preprocess = Preprocessor(config.preprocess_workers)
    media = MediaFetcher(
        max_bytes=config.max_image_bytes,
        timeout=config.image_fetch_timeout,
        allowed_local_path=config.allowed_local_media_path,
        policy=FetchPolicy(allowed_domains=config.allowed_media_domains, allow_private=config.allow_private_media_urls),
    )
    load = ServerLoad(LoadBoard.attach(spec.board_fd), spec.board_slot, spec.index)
    state = AppState(
        config=config,
        card=card,
        engine=engine,
        tokenizer=TextTokenizer(card.tokenizer_json),
        preprocess=preprocess,
        images=ImageLoader(media, card.image, config.max_image_pixels),
        server_index=spec.index,
        started_at=int(time.time()),
        load=load,
    )
    server = GatedServer(
        uvicorn.Config(
            build_app(state, plugins),
            lifespan="off",
            ws="none",  # poolserve serves no WebSocket; apiserver/http_protocol.py, "Upgrades"
            access_log=False,
            log_config=None,
            server_header=False,
            # Applied by the app where something reads the client's address and scheme (apiserver/gate.py).
            proxy_headers=False,
            timeout_keep_alive=config.keep_alive_timeout,  # type: ignore[arg-type]  # uvicorn uses it as seconds
            timeout_graceful_shutdown=int(config.shutdown_timeout),
        ),
        ConnectionPolicy(
            load,
            max_requests=config.max_requests_per_connection,
            max_age_s=config.max_connection_age,
            header_timeout_s=config.header_timeout,
            body_timeout_s=config.body_timeout,
            send_timeout_s=config.send_timeout,
        ),
        config.accept_balance,
        config.max_connections_per_server,
    )
    exit_request.server = server
    server.should_exit = exit_request.is_requested
    serving = asyncio.create_task(server.serve(sockets=[listener]))
    while not server.started and not serving.done():
        await asyncio.sleep(0.005)
    if server.started:
        # What start-up built (modules, the app, the tokenizer's wrappers) lives as long as the process: moved out
        # of the collector's reach, so a full collection walks what requests made, not ~60,000 long-lived objects
        # (~10 ms each time, a few dozen µs a request under load).
        gc.freeze()
        report_boot(spec, BootReport(status="ready"))
    guards = [
        asyncio.create_task(beat(spec)),
        asyncio.create_task(fail_waiting_on_exit(server, engine)),
        asyncio.create_task(sample_loop_lag(spec.index)),
    ]
    try:
        await serving
    finally:
        for guard in guards:
            guard.cancel()
        preprocess.close()
        await media.aclose()
        await engine.close()
    return 0
