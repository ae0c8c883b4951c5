"""Errors the engine client raises; the API server maps them to HTTP statuses."""

from __future__ import annotations


class EngineUnavailable(RuntimeError):
    """No engine is there to take or finish the request (503)."""


class EngineOverloaded(RuntimeError):
    """The engine's queue is at its limit; try again shortly (429)."""


class EngineError(RuntimeError):
    """The engine took the request and failed it; the message says why (500)."""


class PoisonPill(EngineError):
    """The request was running each time the engine died, twice: it is the likely cause (500)."""

    def __init__(self, request_id: int):
        super().__init__(
            f"request {request_id} was running in the model each time the engine crashed, twice in a row; "
            "it is the likely cause and was not retried again"
        )
