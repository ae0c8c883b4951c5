"""The API layer's fixtures: `serve` (the real app over an in-process engine, tests/apiserver/test_request_cycle.py)
for every module of this folder."""

from __future__ import annotations

from tests.apiserver.test_request_cycle import serve

__all__ = ["serve"]
