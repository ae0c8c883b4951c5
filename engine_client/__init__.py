"""Client side of the engine wire, used by every API server."""

from engine_client.client import EngineClient, PooledResult
from engine_client.errors import EngineError, EngineOverloaded, EngineUnavailable, PoisonPill

__all__ = ["EngineClient", "EngineError", "EngineOverloaded", "EngineUnavailable", "PoisonPill", "PooledResult"]
