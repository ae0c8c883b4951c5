"""Every test in this folder starts real `launch` processes (or drives one the session started): marked `e2e`, so that
`pytest -m e2e` runs them alone and `pytest -m "not e2e"` runs the rest of the suite without them."""

from __future__ import annotations

from pathlib import Path

import pytest

HERE = Path(__file__).parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # Called with the whole session's items, whichever conftest defines it: only this folder's are marked.
    for item in items:
        if HERE in item.path.parents:
            item.add_marker(pytest.mark.e2e)
