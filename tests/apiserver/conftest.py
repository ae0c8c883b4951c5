"""The API layer's fixtures: `serve` (the real app over an in-process engine, tests/apiserver/served_app.py)
for every module of this folder; `hf_tokenizer`, a Qwen-style BPE tokenizer (bench/harness/llm_reranker.py) for the LLM
rerankers' prompt readers (tests/utils.py's `reranker_card` makes a card over it)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
from starlette.testclient import TestClient

from apiserver.app import build_app
from apiserver.connection.fair_accept import ServerLoad
from apiserver.images.media import MediaFetcher
from apiserver.images.sources import ImageLoader
from apiserver.requests.endpoints import Endpoint
from apiserver.requests.preprocess import Preprocessor
from apiserver.requests.served_models import ServedModels
from apiserver.requests.state import AppState
from apiserver.requests.tokenizer import TextTokenizer
from bench.harness.llm_reranker import bpe_tokenizer
from engine_client import InProcessEngine
from poolserve.config import Config
from poolserve.load_board import LoadBoard
from tests.apiserver.served_app import Served, answering, make_card


@pytest.fixture(scope="module")
def hf_tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Any:
    folder: Path = tmp_path_factory.mktemp("bpe")
    return bpe_tokenizer(folder)


@pytest.fixture
def serve(bundled_model: Path) -> Iterator[Any]:
    """serve(card changes, config changes, engine answer, extra endpoints, other models, *, tracer) -> Served.
    `others`: more models served beside the first (the default), each as (card changes, config changes), over
    engines of their own (Served.states)."""
    board = LoadBoard.create()
    opened: list[tuple[TestClient, Preprocessor]] = []

    def start(
        card: dict[str, Any] | None = None,
        config: dict[str, Any] | None = None,
        engine_answer: Any = None,
        extra: list[Endpoint] | None = None,
        others: list[tuple[dict[str, Any], dict[str, Any]]] | None = None,
        *,
        tracer: Any = None,
    ) -> Served:
        settings = Config(**(config or {}))
        preprocess = Preprocessor(settings.preprocess_workers)
        media = MediaFetcher(max_bytes=settings.max_image_bytes, timeout=1.0, allowed_local_path="")

        def model_state(card_changes: dict[str, Any], config_changes: dict[str, Any], answer: Any) -> AppState:
            model_card = make_card(bundled_model, **card_changes)
            model_config = msgspec.structs.replace(settings, **config_changes)
            return AppState(
                config=model_config, card=model_card,
                engine=InProcessEngine(answer or answering(model_card.output_size)),
                tokenizer=TextTokenizer(model_card.tokenizer_json), preprocess=preprocess,
                images=ImageLoader(media, model_card.image, settings.max_image_pixels),
                server_index=0, started_at=0, load=ServerLoad(board, 0, 0), tracer=tracer,
            )  # fmt: skip

        states = [model_state(card or {}, {}, engine_answer)]
        states += [model_state(card_changes, config_changes, None) for card_changes, config_changes in others or []]
        client = TestClient(build_app(states[0], extra or [], ServedModels(states)))
        opened.append((client, preprocess))
        return Served(client.__enter__(), states)

    yield start
    for client, preprocess in opened:
        client.__exit__(None, None, None)
        preprocess.close()
    board.close()
