"""How a request waiting on the engine hears that its client left: no task of its own per request.

ASGI's way to notice a disconnect is a second task blocked in `receive()`, and a wait on both it and the work:
two tasks, a waiter and a cancellation per request, tens of µs. Here the request's task registers itself in
the request's state while it waits (`watch`), and the connection (apiserver/connection/http_protocol.py) cancels it when
the client goes (`client_left`); `is_gone` tells that cancellation from any other.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, MutableMapping
from typing import Any

# Keys in the ASGI scope's "state" (Starlette's request.state), which uvicorn's cycle and the app share.
WAITING_TASK = "poolserve.waiting_task"
GONE = "poolserve.client_gone"


def watch(state: MutableMapping[str, Any]) -> bool:
    """Cancel the current task if the client leaves while it is registered; False if the client is gone already."""
    if state.get(GONE):
        return False
    state[WAITING_TASK] = asyncio.current_task()
    return True


def unwatch(state: MutableMapping[str, Any]) -> None:
    state.pop(WAITING_TASK, None)


def is_gone(state: MutableMapping[str, Any]) -> bool:
    return bool(state.get(GONE))


def client_left(scope: Mapping[str, object]) -> None:
    """The connection of the request whose scope this is closed before its answer was sent."""
    state = scope.get("state")
    if not isinstance(state, dict):
        return
    state[GONE] = True
    task: asyncio.Task[Any] | None = state.pop(WAITING_TASK, None)
    if task is not None:
        task.cancel()
