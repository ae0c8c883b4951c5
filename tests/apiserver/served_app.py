"""The real Starlette app and request cycle over an in-process engine whose rows are computed from the token
ids (and pixels) it is sent, so each answer can be checked against the tokenizer (the `serve` fixture,
tests/apiserver/conftest.py)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
from starlette.testclient import TestClient

from apiserver.requests.state import AppState
from engine_client import InProcessEngine, PooledResult
from poolserve.model_card import CLASSIFIER, ImageProcessing, ModelCard
from poolserve.protocol import EngineRequest

DIM = 8
PIXEL_PNG = (
    "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAIAAACQd1PeAAAADElEQVR4nGP4z8AAAAMBAQDJ/pLvAAAAAElFTkSuQmCC"
)
MESSAGE = (
    "`{param}` has {count} inputs, more than this server's limit of {limit} per request (--max-inputs-per-request)."
)


def text_row(ids: list[int], dim: int) -> list[float]:
    """The fake engine's row for a text input: its length, its id sum, then a ramp, all from the ids."""
    return [float(len(ids)), float(sum(ids) % 1000), *(float(ids[0] + j) for j in range(dim - 2))]


def image_row(pixels: np.ndarray[Any, Any], dim: int) -> list[float]:
    return [-1.0, float(pixels.mean()), *([0.0] * (dim - 2))]


def answering(output_size: int) -> Callable[[EngineRequest], PooledResult]:
    """An engine of `output_size`-long rows, computed from the inputs, in the engine's order: texts, then images."""

    def answer(request: EngineRequest) -> PooledResult:
        ids = request.tokens
        dim = request.params.dimensions or output_size
        rows, start = [], 0
        for length in request.lengths:
            rows.append(text_row(ids[start : start + length].tolist(), output_size)[:dim])
            start += length
        if request.pixels is not None:
            pixels = request.pixels.reshape(request.images, -1)
            rows.extend(image_row(image, output_size)[:dim] for image in pixels)
        return PooledResult(np.asarray(rows, dtype=np.float32).reshape(len(rows), dim))

    return answer


def make_card(bundled_model: Path, **changes: Any) -> ModelCard:
    card = ModelCard(
        path=str(bundled_model), architecture="BertModel", kind="embedding",
        tasks=["embed", "score", "pool", "tokenize"], max_model_len=256, output_size=DIM, vocab_size=30522,
        pooling="mean", normalize=True, pad_token_id=0,
        tokenizer_json=(bundled_model / "tokenizer.json").read_text(), device="cpu", dtype="float32",
    )  # fmt: skip
    return msgspec.structs.replace(card, **changes)


CLASSIFIER_CHANGES: dict[str, Any] = {
    "architecture": "BertForSequenceClassification", "kind": CLASSIFIER, "tasks": ["classify", "pool", "tokenize"],
    "output_size": 3, "labels": ["negative", "neutral", "positive"], "activation": "softmax",
}  # fmt: skip
CLIP_CHANGES: dict[str, Any] = {
    "architecture": "CLIPModel", "kind": "clip",
    "image": ImageProcessing(resize_shortest_edge=2, crop_height=2, crop_width=2), "image_tokens": 4,
}  # fmt: skip


class Served:
    """A test client of the real app, and the in-process engine behind it."""

    def __init__(self, client: TestClient, states: list[AppState]):
        self.client = client
        # Every model's state, the default first: `state` and `engine` are the default model's.
        self.states = states
        self.state = states[0]
        assert isinstance(self.state.engine, InProcessEngine)
        self.engine: InProcessEngine = self.state.engine

    def post(self, path: str, body: object, status: int = 200) -> Any:
        response = self.client.post(path, json=body)
        assert response.status_code == status, response.text
        return response.json()

    def tokens(self, text: str) -> list[int]:
        return self.state.tokenizer.encode([text])[0]
