"""tests/conftest.py's `server` and `guarded_server` under the same names, and one server per tiny test model, started
in this process (stack_server.py): the tests here send the same requests and hold the answers to the same references
as against `launch`, in a model load each instead of a `launch` (one API server: what needs several, or the processes
themselves, is in tests/e2e)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from poolserve.config import API_KEY_ENV
from tests.conftest import (
    API_KEY,
    CLIP_MAX_IMAGE_BYTES,
    CORS_ORIGIN,
    GUARDED_BODIES_IN_FLIGHT,
    GUARDED_BODY_LIMIT,
    GUARDED_CACHE_BYTES,
    GUARDED_TOKEN_LIMIT,
)
from tests.in_process.stack_server import InProcessServer, served
from tests.utils import FLOAT32_CPU


def serve(*args: str) -> Iterator[InProcessServer]:
    """A session's server, in float32 on the CPU (tests/conftest.py's `server` says why)."""
    with served(*args, *FLOAT32_CPU) as started:
        yield started


@pytest.fixture(scope="session")
def server() -> Iterator[InProcessServer]:
    yield from serve()


@pytest.fixture(scope="session")
def cross_encoder_server(cross_encoder_model: Path) -> Iterator[InProcessServer]:
    yield from serve("--model", str(cross_encoder_model))


@pytest.fixture(scope="session")
def classifier_server(classifier_model: Path) -> Iterator[InProcessServer]:
    yield from serve("--model", str(classifier_model))


@pytest.fixture(scope="session")
def splade_server(splade_model: Path) -> Iterator[InProcessServer]:
    yield from serve("--model", str(splade_model))


@pytest.fixture(scope="session")
def clip_server(clip_model: Path, media_dir: Path) -> Iterator[InProcessServer]:
    yield from serve(
        "--model", str(clip_model), "--allowed-local-media-path", str(media_dir),
        "--max-image-bytes", str(CLIP_MAX_IMAGE_BYTES), "--image-fetch-timeout", "1", "--allow-private-media-urls",
    )  # fmt: skip


@pytest.fixture(scope="session")
def guarded_server() -> Iterator[InProcessServer]:
    """tests/conftest.py's `guarded_server`: a key (from the environment), CORS for one origin, lowered limits."""
    with served(
        "--cors-allowed-origins", CORS_ORIGIN, "--max-request-bytes", str(GUARDED_BODY_LIMIT),
        "--max-tokens-per-request", str(GUARDED_TOKEN_LIMIT), "--max-body-bytes-in-flight",
        str(GUARDED_BODIES_IN_FLIGHT), "--cache-bytes", str(GUARDED_CACHE_BYTES), "--cache-hits-header", *FLOAT32_CPU,
        env={API_KEY_ENV: API_KEY},
    ) as started:  # fmt: skip
        yield started
