"""One API-server process: handshake with the engine, then serve HTTP on the shared socket."""

from __future__ import annotations

import asyncio
import functools
import logging
import signal
import socket
import time
from types import FrameType
from typing import TYPE_CHECKING

import uvicorn
import uvloop

# uvicorn's own matcher of --forwarded-allow-ips (addresses, networks, *): the same proxies it trusts, matched alike.
from uvicorn.middleware.proxy_headers import _TrustedHosts

from apiserver.app import build_app
from apiserver.connection.client_share import ClientShare
from apiserver.connection.fair_accept import ServerLoad
from apiserver.connection.gated_server import GatedServer
from apiserver.connection.http_protocol import ConnectionPolicy
from apiserver.connection.tracing import start_tracing
from apiserver.images.fetch_guard import FetchPolicy
from apiserver.images.media import MediaFetcher
from apiserver.images.sources import ImageLoader
from apiserver.metrics import sample_loop_lag
from apiserver.plugins import PluginError, load_plugins
from apiserver.requests.preprocess import Preprocessor
from apiserver.requests.served_models import ServedModels
from apiserver.requests.state import AppState
from apiserver.requests.tokenizer import TextTokenizer
from engine_client import EngineClient, EngineUnavailable
from poolserve.boot import (
    EXIT_BOOT_ERROR,
    BootReport,
    ChildSpec,
    report_boot,
    send_heartbeat,
)
from poolserve.collector import settle
from poolserve.load_board import LoadBoard
from poolserve.logs import configure_logging
from poolserve.model_card import ModelCard

if TYPE_CHECKING:
    from apiserver.connection.request_tracer import RequestTracer

logger = logging.getLogger("poolserve.api")

HEARTBEAT_INTERVAL_S = 1.0
# How long before --shutdown-timeout ends a drain the requests still waiting for their engine are answered: at the
# timeout uvicorn cancels what is left.
LAST_ANSWERS_S = 0.5


class ExitRequest:
    """Records SIGTERM/SIGINT that arrive before uvicorn takes the signals over, and hands them on."""

    def __init__(self) -> None:
        self.is_requested = False
        self.server: uvicorn.Server | None = None

    def handle_term(self, signum: int, frame: FrameType | None) -> None:
        self.is_requested = True
        if self.server is not None:
            self.server.should_exit = True


def engine_out_of_service(board: LoadBoard, first: int, index: int) -> bool:
    """Whether a model's engine `index` (its client counts from 0; the board from the first model's first) is out
    of service."""
    return board.is_engine_out_of_service(first + index)


async def beat(spec: ChildSpec) -> None:
    """The heartbeat comes from the event loop itself: a blocked loop stops it, and the supervisor
    replaces this process after --worker-timeout."""
    while True:
        send_heartbeat(spec)
        await asyncio.sleep(HEARTBEAT_INTERVAL_S)


async def fail_waiting_on_exit(server: uvicorn.Server, engines: list[EngineClient], shutdown_timeout: int) -> None:
    """Once asked to stop, requests waiting for an engine that is not there get their 503 now, instead of holding
    the drain open until --shutdown-timeout. And just before that timeout, those still waiting for their engine (a
    hung or slow one) get theirs: at the timeout uvicorn cancels what is left, and its client read a bare
    `500 Internal Server Error`, in no API's error shape, with a traceback in the log."""
    while not server.should_exit:
        await asyncio.sleep(0.1)
    loop = asyncio.get_running_loop()
    # uvicorn's timeout starts a little after should_exit is seen (its loop's next tick, and 0.1 s more).
    last_answers = loop.time() + shutdown_timeout - LAST_ANSWERS_S
    out_of_time = (
        f"the server is stopping and this request did not finish within --shutdown-timeout ({shutdown_timeout}s)"
    )
    while True:
        is_out_of_time = loop.time() >= last_answers
        for engine in engines:
            if is_out_of_time:
                engine.fail_waiting(out_of_time)
            elif not engine.is_ready:
                engine.fail_waiting("the API server is stopping and no engine is running")
        await asyncio.sleep(0.1)


async def connect_all(engines: list[EngineClient], timeout: float) -> list[ModelCard]:
    """Each model's card, once one of its engines answers (all models: each needs its tokenizer to serve)."""
    return list(await asyncio.gather(*(engine.connect(timeout) for engine in engines)))


async def close_all(engines: list[EngineClient]) -> None:
    for engine in engines:
        await engine.close()


def run(spec: ChildSpec) -> int:
    configure_logging(spec.name, spec.config.log_level, spec.config.log_format)
    exit_request = ExitRequest()
    # uvicorn re-raises the signal that stopped it once it restores these handlers; ours then
    # only records it, and the process exits 0.
    signal.signal(signal.SIGTERM, exit_request.handle_term)
    signal.signal(signal.SIGINT, exit_request.handle_term)
    listener = socket.socket(fileno=spec.listen_fd)
    tracer = start_tracing(spec.config, spec.index)
    try:
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            return runner.run(serve(spec, listener, exit_request, tracer))
    finally:
        # After the loop: the last spans (of the requests drained) are sent, and no request waits on it.
        if tracer is not None:
            tracer.shutdown()


async def serve(
    spec: ChildSpec, listener: socket.socket, exit_request: ExitRequest, tracer: RequestTracer | None = None
) -> int:
    config = spec.config
    try:
        plugins = load_plugins(config.plugins)
    except PluginError as exc:
        report_boot(spec, BootReport(status="failed", message=f"API server {spec.index}: {exc}"))
        return EXIT_BOOT_ERROR
    board = LoadBoard.attach(spec.board_fd)
    # One client per model, each over that model's engines (several models: poolserve/served_models.py); the load
    # board numbers engines across the models, a client from 0.
    engines = [
        EngineClient(
            spec.engine_endpoints_of(number),
            spec.index,
            flight_records=spec.flight_records_of(number),
            wait_timeout=config.engine_wait_timeout,
            suspect_wait=config.engine_start_timeout,
            is_out_of_service=functools.partial(engine_out_of_service, board, spec.layout.engines_of(number).start),
            stall_limit=config.engine_stall_limit,
        )
        for number in range(len(spec.served_models))
    ]
    # A replacement API server may start while the engine itself restarts: wait as long as an engine
    # boot, but stop waiting at once when told to stop.
    connecting = asyncio.create_task(connect_all(engines, config.engine_start_timeout))
    while not connecting.done() and not exit_request.is_requested:
        await asyncio.wait({connecting}, timeout=0.1)
    if not connecting.done():
        connecting.cancel()
        await close_all(engines)
        return 0
    try:
        cards = connecting.result()
    except (EngineUnavailable, TimeoutError) as exc:
        report_boot(
            spec,
            BootReport(status="failed", message=f"API server {spec.index} cannot reach the engine: {exc}"),
        )
        await close_all(engines)
        return EXIT_BOOT_ERROR
    preprocess = Preprocessor(config.preprocess_workers)
    media = MediaFetcher(
        max_bytes=config.max_image_bytes,
        timeout=config.image_fetch_timeout,
        allowed_local_path=config.allowed_local_media_path,
        policy=FetchPolicy(allowed_domains=config.allowed_media_domains, allow_private=config.allow_private_media_urls),
    )
    load = ServerLoad(board, spec.board_slot, spec.index)
    started_at = int(time.time())
    models = ServedModels(
        [
            AppState(
                config=model,
                card=card,
                engine=engine,
                tokenizer=TextTokenizer(card.tokenizer_json),
                preprocess=preprocess,
                images=ImageLoader(media, card.image, config.max_image_pixels),
                server_index=spec.index,
                started_at=started_at,
                load=load,
                tracer=tracer,
            )
            for model, card, engine in zip(spec.served_models, cards, engines, strict=True)
        ]
    )
    uvicorn_config = uvicorn.Config(
        build_app(models.default, plugins, models),
        lifespan="off",
        ws="none",  # poolserve serves no WebSocket; apiserver/connection/http_protocol.py, "Upgrades"
        access_log=False,
        log_config=None,
        server_header=False,
        # Applied by the app where something reads the client's address and scheme (apiserver/connection/gate.py).
        proxy_headers=False,
        timeout_keep_alive=config.keep_alive_timeout,  # type: ignore[arg-type]  # uvicorn uses it as seconds
        timeout_graceful_shutdown=int(config.shutdown_timeout),
    )
    # The proxies whose forwarded addresses uvicorn believes (FORWARDED_ALLOW_IPS) are the ones no client share
    # counts (apiserver/connection/client_share.py); matched as uvicorn matches them.
    proxies = _TrustedHosts(uvicorn_config.forwarded_allow_ips)
    server = GatedServer(
        uvicorn_config,
        ConnectionPolicy(
            load,
            clients=ClientShare(config.client_connection_share, proxies.__contains__),
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
        settle()  # the garbage collector (poolserve/collector.py)
        report_boot(spec, BootReport(status="ready"))
    guards = [
        asyncio.create_task(beat(spec)),
        asyncio.create_task(fail_waiting_on_exit(server, engines, uvicorn_config.timeout_graceful_shutdown or 0)),
        asyncio.create_task(sample_loop_lag(spec.index)),
    ]
    try:
        await serving
    finally:
        for guard in guards:
            guard.cancel()
        preprocess.close()
        await media.aclose()
        await close_all(engines)
    return 0
