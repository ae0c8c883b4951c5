"""Every test in this folder starts real `launch` processes (or drives one the session started): marked `e2e`, so that
`pytest -m e2e` runs them alone and `pytest -m "not e2e"` runs the rest of the suite without them."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.models import build_faulty

HERE = Path(__file__).parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # Called with the whole session's items, whichever conftest defines it: only this folder's are marked.
    for item in items:
        if HERE in item.path.parents:
            item.add_marker(pytest.mark.e2e)


@pytest.fixture(scope="session")
def faulty_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny BERT whose own code crashes its engine on CRASH_TOKEN and hangs it on HANG_TOKEN (bench/models.py,
    build_faulty): served with --trust-remote-code and bench.models.remote_code_env's environment."""
    folder = tmp_path_factory.mktemp("faulty-bert")
    build_faulty(folder)
    return folder
