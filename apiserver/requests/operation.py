"""The shape of every endpoint that does work: parse a request into a plan, render rows into bytes.

The request cycle (request_cycle.py) runs both steps, off the event loop, for the built-in
endpoints and for plugins alike; an endpoint only says what its request is and these two steps.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import numpy as np
import numpy.typing as npt

from apiserver.errors import ErrorStyle
from apiserver.images.sources import ImageSource, Pixels
from apiserver.requests.inputs.job import EngineJob
from apiserver.requests.state import AppState
from poolserve.protocol import SparseRows

# The engine's output: one float32 row per input, in the request's order.
Rows = npt.NDArray[np.float32]
# The rows a plan with no engine job renders (tokenize, detokenize).
NO_ROWS: Rows = np.zeros((0, 0), dtype=np.float32)

R = TypeVar("R")  # the decoded request (a msgspec Struct)
C = TypeVar("C")  # what render needs besides the rows
JobBuilder = Callable[[Callable[[ImageSource], Pixels]], EngineJob]


@dataclass(slots=True)
class Plan(Generic[C]):
    """What a parsed request needs done.

    `job`: what the engine runs (None when the answer needs no model, or when remote images must be
    fetched first). `remote`: the images to fetch (on the event loop) before `build` makes the job
    from them (on the preprocessing pool). `context`: whatever render needs besides the rows.
    """

    context: C
    job: EngineJob | None = None
    remote: list[ImageSource] = field(default_factory=list)
    build: JobBuilder | None = None
    # A sparse model's rows, set by the request cycle for an operation that `takes_sparse` (its render then
    # gets no dense rows).
    sparse: SparseRows | None = None

    @property
    def prompt_tokens(self) -> int:
        return 0 if self.job is None else self.job.prompt_tokens


# parse may be a coroutine function: its coroutine is awaited on the event loop (for I/O of its own).
Parse = Callable[[R, AppState], Plan[C] | Awaitable[Plan[C]]]
Render = Callable[[Plan[C], Rows, AppState], bytes]
# The error style a decoded body asks for, on a route several APIs share (None: the endpoint's own).
StyleOf = Callable[[R], ErrorStyle | None]


@dataclass(frozen=True, slots=True)
class Operation(Generic[R, C]):
    """An endpoint's two steps and the msgspec type its JSON body decodes into. `takes_sparse`: its render
    reads a sparse model's rows from `plan.sparse`; any other operation gets them as dense rows."""

    request: type[R]
    parse: Parse[R, C]
    render: Render[C]
    error_style: StyleOf[R] | None = None
    takes_sparse: bool = False


AnyOperation = Operation[Any, Any]
