"""A model folder served in one process: the real API app over the real engine core and model.

The HTTP app, tokenizer, prompts, limits and rendering are the API server's; the loader, scheduler,
model, pooling and heads are the engine's: only the ZeroMQ wire and the processes around them are left
out (they carry the same bytes whatever the model: tests/e2e holds them), so each layout costs a model
load, not a `launch` (8-10 s of torch import on this machine).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
from starlette.testclient import TestClient

from apiserver.app import build_app
from apiserver.connection.fair_accept import ServerLoad
from apiserver.images.media import MediaFetcher
from apiserver.images.sources import ImageLoader
from apiserver.requests.preprocess import Preprocessor
from apiserver.requests.state import AppState
from apiserver.requests.tokenizer import TextTokenizer
from engine_client import EngineError, InProcessEngine, PooledResult
from engine_core.admission import AdmissionLimit
from engine_core.core import EngineCore
from engine_core.load_model import load_model
from engine_core.loader import LoadedModel
from engine_core.request_state import check_request
from poolserve.config import Config
from poolserve.load_board import LoadBoard
from poolserve.model_card import ModelCard
from poolserve.protocol import EngineRequest

SERVER = b"api-0"


def load(folder: Path, **flags: Any) -> LoadedModel:
    """The folder loaded as `launch --model folder --device cpu --dtype float32` would load it."""
    return load_model(Config(model=str(folder), device="cpu", dtype="float32", **flags))


def core_answer(core: EngineCore) -> Any:
    """The engine core's answer to one request, computed in the caller's thread (the I/O thread's part:
    check, admit, queue; then steps until the request is done)."""

    def answer(request: EngineRequest) -> PooledResult:
        pending = check_request(SERVER, request, core.card)
        assert core.admission.try_admit(pending.count, pending.total_cost, force=True)
        core.add(pending)
        while (batch := core.next_batch()) is not None:
            step = core.run_batch(batch)
            for failure in step.failures.get(SERVER, []):
                raise EngineError(failure.message)
            for out, rows in step.outputs.get(SERVER, []):
                if out.id == request.id:
                    return PooledResult(rows)
        raise AssertionError(f"request {request.id} never finished")

    return answer


@contextmanager
def serve_in_process(loaded: LoadedModel, **flags: Any) -> Iterator[httpx.Client]:
    config = Config(device="cpu", dtype="float32", **flags)
    card: ModelCard = loaded.card
    board = LoadBoard.create()
    preprocess = Preprocessor(0)
    media = MediaFetcher(max_bytes=config.max_image_bytes, timeout=1.0, allowed_local_path="")
    core = EngineCore(loaded, AdmissionLimit(max_inputs=config.max_queued_inputs, max_tokens=config.max_queued_tokens))
    state = AppState(
        config=config, card=card, engine=InProcessEngine(core_answer(core)),
        tokenizer=TextTokenizer(card.tokenizer_json), preprocess=preprocess,
        images=ImageLoader(media, card.image, config.max_image_pixels), server_index=0, started_at=0,
        load=ServerLoad(board, 0, 0),
    )  # fmt: skip
    try:
        with TestClient(build_app(state, [])) as client:
            yield client
    finally:
        preprocess.close()
        board.close()


class AppTransport(httpx.BaseTransport):
    """An httpx transport that hands each request to a Starlette TestClient, so that a client library built on httpx
    (cohere's) can call the in-process app: the TestClient is an httpx2 client since Starlette 1.10, which such a
    library refuses to take as its own."""

    def __init__(self, client: Any):
        self.client = client

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        answer = self.client.request(
            request.method, str(request.url), headers=request.headers.multi_items(), content=request.read()
        )
        # the body comes decoded: the headers that described it encoded are left out
        headers = [(k, v) for k, v in answer.headers.multi_items() if k.lower() not in SPENT_HEADERS]
        return httpx.Response(answer.status_code, headers=headers, content=answer.content)


SPENT_HEADERS = ("content-encoding", "content-length", "transfer-encoding")
