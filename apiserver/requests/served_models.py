"""Which of the models an API server serves answers a request: the one its `model` field names, else the default
(the first declared), which routes without a `model` field (TEI's) always get."""

from __future__ import annotations

from collections.abc import Sequence

from apiserver.requests.state import AppState
from apiserver.requests.validation import check_model


class ServedModels:
    """Every model's AppState, the default first, by the names clients use."""

    def __init__(self, states: Sequence[AppState]) -> None:
        if not states:
            raise ValueError("an API server serves at least one model")
        self.states = tuple(states)
        self._by_name = {name: state for state in self.states for name in state.model_names}
        self.names = list(self._by_name)

    @property
    def default(self) -> AppState:
        return self.states[0]

    def pick(self, requested: str | None) -> AppState:
        """The model a request names; none named: the default. An unknown name is a 404 listing every name."""
        if requested is None:
            return self.default
        check_model(requested, self.names)
        return self._by_name[requested]
