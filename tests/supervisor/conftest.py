"""The supervisor's loop with stub children (stubs.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.supervisor.stubs import Run, stub_run


@pytest.fixture
def stubs(tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> Iterator[Run]:
    with stub_run(tmp_path, capsys, monkeypatch) as run:
        yield run
