"""Errors the engine client raises; the API server maps them to HTTP statuses."""

from __future__ import annotations


class EngineUnavailable(RuntimeError):
    """No engine is there to take or finish the request (503)."""


class EngineError(RuntimeError):
    """The engine took the request and failed it; the message says why (500)."""
