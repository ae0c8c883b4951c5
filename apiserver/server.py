"""One API-server process: handshake with the engine, then serve HTTP on the shared socket."""

from __future__ import annotations

import asyncio
import logging
import signal
import socket
import time
from types import FrameType

import uvicorn
import uvloop

from apiserver.app import build_app
from apiserver.fetch_guard import FetchPolicy
from apiserver.http_protocol import BoundedHttpToolsProtocol
from apiserver.inputs.image_sources import ImageLoader
from apiserver.media import MediaFetcher
from apiserver.preprocess import Preprocessor
from apiserver.state import AppState
from apiserver.tokenizer import TextTokenizer
from engine_client import EngineClient, EngineUnavailable
from engine_core.boot import EXIT_BOOT_ERROR, BootReport, ChildSpec, report_boot, test_hooks_enabled
from engine_core.logs import configure_logging

logger = logging.getLogger("poolserve.api")

ENGINE_HANDSHAKE_TIMEOUT_S = 30.0


class ExitRequest:
    """Records SIGTERM/SIGINT that arrive before uvicorn takes the signals over, and hands them on."""

    def __init__(self) -> None:
        self.is_requested = False
        self.server: uvicorn.Server | None = None

    def handle_term(self, signum: int, frame: FrameType | None) -> None:
        self.is_requested = True
        if self.server is not None:
            self.server.should_exit = True


def run(spec: ChildSpec) -> int:
    configure_logging(spec.name, spec.config.log_level)
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
    engine = EngineClient(spec.engine_endpoint, spec.index)
    try:
        card = await engine.connect(ENGINE_HANDSHAKE_TIMEOUT_S)
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
    state = AppState(
        config=config,
        card=card,
        engine=engine,
        tokenizer=TextTokenizer(card.tokenizer_json),
        preprocess=preprocess,
        images=ImageLoader(media, card.image, config.max_image_pixels),
        server_index=spec.index,
        started_at=int(time.time()),
    )
    server = uvicorn.Server(
        uvicorn.Config(
            build_app(state, test_hooks=test_hooks_enabled()),
            http=BoundedHttpToolsProtocol,
            lifespan="off",
            access_log=False,
            log_config=None,
            server_header=False,
            timeout_graceful_shutdown=int(config.shutdown_timeout),
        )
    )
    exit_request.server = server
    server.should_exit = exit_request.is_requested
    serving = asyncio.create_task(server.serve(sockets=[listener]))
    while not server.started and not serving.done():
        await asyncio.sleep(0.005)
    if server.started:
        report_boot(spec, BootReport(status="ready"))
    try:
        await serving
    finally:
        preprocess.close()
        await media.aclose()
        await engine.close()
    return 0
