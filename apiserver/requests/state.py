"""Everything a route needs, built once per API-server process after the engine handshake."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from apiserver.connection.fair_accept import ServerLoad
from apiserver.images.sources import ImageLoader
from apiserver.requests.limits import TokenBudget, token_budget
from apiserver.requests.preprocess import Preprocessor
from apiserver.requests.tokenizer import TextTokenizer
from engine_client import PoolingEngine
from poolserve.config import Config
from poolserve.model_card import ModelCard

if TYPE_CHECKING:
    from apiserver.connection.request_tracer import RequestTracer


@dataclass(frozen=True, slots=True)
class AppState:
    config: Config
    card: ModelCard
    engine: PoolingEngine
    tokenizer: TextTokenizer
    preprocess: Preprocessor
    images: ImageLoader
    server_index: int
    started_at: int
    load: ServerLoad
    # Set when tracing is on (apiserver/connection/tracing.py).
    tracer: RequestTracer | None = None

    @property
    def model_name(self) -> str:
        return self.config.model_names[0]

    @property
    def token_budget(self) -> TokenBudget:
        return token_budget(self.config)

    @property
    def model_names(self) -> list[str]:
        return self.config.model_names
