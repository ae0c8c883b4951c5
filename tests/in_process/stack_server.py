"""`launch` of one model, one API server and one engine, in the test's process: the same objects the two processes
build, each on a thread of its own, over the same ZeroMQ wire (an ipc socket in a temporary folder).

The engine's side is the real `EngineProcess` (its I/O thread, scheduler, model and replies) and the API server's
the real `EngineClient`, app and plugins, served by its own uvicorn server (GatedServer, its HTTP protocol and
connection policy) on a free loopback port, so that the clients users have (openai, cohere, huggingface_hub, curl,
schemathesis) reach it by URL. Only the supervisor, the shared socket, several processes and signals are left out:
their tests start `launch` (tests/e2e). Costs a model load, not a `launch` (8-10 s of torch import per process on a
2-core host).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import socket
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import uvicorn

from apiserver.app import build_app
from apiserver.connection.client_share import ClientShare
from apiserver.connection.fair_accept import ServerLoad
from apiserver.connection.gated_server import GatedServer
from apiserver.connection.http_protocol import ConnectionPolicy
from apiserver.connection.tracing import start_tracing
from apiserver.images.fetch_guard import FetchPolicy
from apiserver.images.media import MediaFetcher
from apiserver.images.sources import ImageLoader
from apiserver.plugins import load_plugins
from apiserver.requests.preprocess import Preprocessor
from apiserver.requests.state import AppState
from apiserver.requests.tokenizer import TextTokenizer
from bench.harness.server_process import wait_until
from engine_client import EngineClient
from engine_core.admission import AdmissionLimit
from engine_core.embedding_cache import EmbeddingCache
from engine_core.engine import EngineProcess
from engine_core.flight_recorder import FlightRecorder
from engine_core.load_model import load_model
from engine_core.scheduler import PriorityPolicy
from poolserve.boot import engine_endpoint
from poolserve.config import Config
from poolserve.flight_record import flight_record_path
from poolserve.load_board import LoadBoard
from supervisor.cli import parse_config

START_TIMEOUT_S = 60.0


@contextlib.contextmanager
def environment(env: dict[str, str]) -> Iterator[None]:
    """`env` set for a while (an API key comes from POOLSERVE_API_KEY, as operators pass it)."""
    saved = {name: os.environ.get(name) for name in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


class InProcessServer:
    """`launch` with these flags (one model, one API server, one engine), started in this process; `url`, `port`
    and `client()` as tests/utils.py's PoolserveProcess has them."""

    def __init__(self, *args: str, env: dict[str, str] | None = None):
        self._env = env or {}
        with environment(self._env):
            self.config: Config = parse_config(["--host", "127.0.0.1", "--port", "0", *args])
        self._runtime_dir = tempfile.mkdtemp(prefix="poolserve-in-process-")
        self._endpoint = engine_endpoint(self._runtime_dir, 0, 1)
        self._flight_record = flight_record_path(self._runtime_dir, "engine")
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self._engine: EngineProcess | None = None
        self._server: GatedServer | None = None
        self._threads: list[threading.Thread] = []
        self._failure: BaseException | None = None

    def start(self) -> InProcessServer:
        """The model loaded and the engine answering, as engine_core/__main__.py does; then the API server's
        handshake and uvicorn, as apiserver/process.py does; returns once it accepts connections. `env` is set
        meanwhile (read at start, as by OpenTelemetry's SDK), and only meanwhile: `launch` processes that tests
        start later must not inherit it."""
        with environment(self._env):
            return self._start()

    def _start(self) -> InProcessServer:
        config = self.config
        loaded = load_model(config)
        self._engine = EngineProcess(
            loaded,
            self._endpoint,
            admission=AdmissionLimit.for_engine(config.max_queued_inputs, config.max_queued_tokens, 0, 1),
            recorder=FlightRecorder(self._flight_record),
            beat=lambda: None,
            cache=EmbeddingCache(config.cache_bytes),
            priority=PriorityPolicy(config.min_priority, config.priority_max_wait),
        )
        self._start_thread("engine", self._engine.run)
        self._start_thread("api", lambda: asyncio.run(self._serve()))
        started = wait_until(
            lambda: self._failure is not None or (self._server is not None and self._server.started), START_TIMEOUT_S
        )
        if self._failure is not None or not started:
            self.stop()
            raise RuntimeError(f"the in-process server did not start within {START_TIMEOUT_S:.0f}s") from self._failure
        return self

    def engine(self) -> EngineProcess:
        """The engine this server started, for a test that looks into its core."""
        assert self._engine is not None, "not started"
        return self._engine

    def _start_thread(self, name: str, target: Any) -> None:
        def run() -> None:
            try:
                target()
            except BaseException as exc:
                self._failure = exc
                raise

        thread = threading.Thread(target=run, name=f"in-process-{name}", daemon=True)
        thread.start()
        self._threads.append(thread)

    async def _serve(self) -> None:
        config = self.config
        engine = EngineClient(
            [self._endpoint], 0, flight_records=[self._flight_record], wait_timeout=config.engine_wait_timeout,
            suspect_wait=config.engine_start_timeout, stall_limit=config.engine_stall_limit,
        )  # fmt: skip
        board = LoadBoard.create()
        preprocess = Preprocessor(config.preprocess_workers)
        tracer = start_tracing(config, 0)
        try:
            card = await engine.connect(START_TIMEOUT_S)
            load = ServerLoad(board, board.claim_slot(os.getpid()), 0)
            media = MediaFetcher(
                max_bytes=config.max_image_bytes, timeout=config.image_fetch_timeout,
                allowed_local_path=config.allowed_local_media_path,
                policy=FetchPolicy(
                    allowed_domains=config.allowed_media_domains, allow_private=config.allow_private_media_urls
                ),
            )  # fmt: skip
            state = AppState(
                config=config, card=card, engine=engine, tokenizer=TextTokenizer(card.tokenizer_json),
                preprocess=preprocess, images=ImageLoader(media, card.image, config.max_image_pixels), server_index=0,
                started_at=0, load=load, tracer=tracer,
            )  # fmt: skip
            app = build_app(state, load_plugins(config.plugins))
            uvicorn_config = uvicorn.Config(
                app, lifespan="off", ws="none", access_log=False, log_config=None, server_header=False,
                proxy_headers=False, timeout_keep_alive=config.keep_alive_timeout,  # type: ignore[arg-type]
            )  # fmt: skip
            # The process's server and connection policy: its HTTP protocol (bounded headers, Host, timeouts) and
            # its accept loop, over this one listening socket (no sibling to share it with).
            policy = ConnectionPolicy(
                load, clients=ClientShare(config.client_connection_share, lambda host: False),
                max_requests=config.max_requests_per_connection, max_age_s=config.max_connection_age,
                header_timeout_s=config.header_timeout, body_timeout_s=config.body_timeout,
                send_timeout_s=config.send_timeout,
            )  # fmt: skip
            self._server = GatedServer(uvicorn_config, policy, config.accept_balance, config.max_connections_per_server)
            await self._server.serve(sockets=[self._listener])
        finally:
            await engine.close()
            preprocess.close()
            board.close()
            if tracer is not None:
                tracer.shutdown()

    def client(self, **kwargs: Any) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=60, **kwargs)

    def stop(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
        for thread in self._threads[1:]:
            thread.join(30)
        if self._engine is not None:
            self._engine.request_exit()
        for thread in self._threads[:1]:
            thread.join(30)
        self._listener.close()
        shutil.rmtree(self._runtime_dir, ignore_errors=True)


@contextlib.contextmanager
def served(*args: str, env: dict[str, str] | None = None) -> Iterator[InProcessServer]:
    server = InProcessServer(*args, env=env)
    try:
        yield server.start()
    finally:
        server.stop()


def served_folder(folder: Path, *args: str) -> contextlib.AbstractContextManager[InProcessServer]:
    """A model folder served in float32 on the CPU (the references' precision: tests/utils.py's FLOAT32_CPU)."""
    return served("--model", str(folder), "--device", "cpu", "--dtype", "float32", *args)
