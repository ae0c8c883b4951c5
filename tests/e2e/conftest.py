"""Every test in this folder starts real `launch` processes (or drives one the session started): marked `e2e`, so that
`pytest -m e2e` runs them alone and `pytest -m "not e2e"` runs the rest of the suite without them."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from bench.harness.models import build_faulty
from bench.harness.server_process import PoolserveProcess

HERE = Path(__file__).parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # Called with the whole session's items, whichever conftest defines it: only this folder's are marked.
    for item in items:
        if HERE in item.path.parents:
            item.add_marker(pytest.mark.e2e)


@pytest.fixture(scope="session")
def faulty_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny BERT whose own code crashes its engine on CRASH_TOKEN and hangs it on HANG_TOKEN (bench/harness/models.py,
    build_faulty): served with --trust-remote-code and bench.harness.models.remote_code_env's environment."""
    folder = tmp_path_factory.mktemp("faulty-bert")
    build_faulty(folder)
    return folder


@pytest.fixture(scope="session")
def recycling_server() -> Iterator[PoolserveProcess]:
    """The bundled model behind 2 API servers whose keep-alive connections are recycled after 3 requests or 2 s, with
    the access log on: tests/e2e/test_connection_spread.py's recycling tests and tests/e2e/test_metrics.py's (its
    dashboard's 'Connections recycled' panel needs connections recycled under any host's speed), one launch for both.
    Its counters are the whole session's: tests read what they add."""
    launched = PoolserveProcess(
        "--api-server-count", "2", "--max-requests-per-connection", "3", "--max-connection-age", "2", "--access-log"
    )
    try:
        yield launched.wait_ready(timeout=120)
    finally:
        launched.stop()
