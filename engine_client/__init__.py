"""Client side of the engine wire, used by every API server."""

from engine_client.client import EngineClient, PooledResult
from engine_client.errors import EngineError, EngineOverloaded, EngineUnavailable, PoisonPill
from engine_client.in_process import InProcessEngine
from engine_client.interface import PoolingEngine

__all__ = [
    "EngineClient",
    "EngineError",
    "EngineOverloaded",
    "EngineUnavailable",
    "InProcessEngine",
    "PoisonPill",
    "PooledResult",
    "PoolingEngine",
]
