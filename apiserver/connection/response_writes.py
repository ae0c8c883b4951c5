"""A response's head and its first body part written to the connection together, in one send.

uvicorn's request cycle writes a response's status line and headers when the app sends `http.response.start`,
and the body when it sends `http.response.body`: two writes, so two `send` system calls and two TCP segments for
every answer, however small (with TCP_NODELAY, which fair accept sets, each leaves at once; without it the body
waited on the client's delayed ACK). The cycle writes through this view of the connection's transport instead,
which holds the head until the next write and passes both in one `writelines` (a single vectored send, no copy).
Nothing else changes: every other write goes straight through, and a held head is written before the connection
closes (an app that fails after starting its answer sends the head, then the connection ends, as before). A streamed
answer's head would leave with its first part rather than before it; poolserve streams none. An answer to HEAD has no
body write to carry its head, so its cycle is not given this view (apiserver/connection/http_protocol.py).

The view reads the cycle's `response_started` through a weak reference: the cycle holds the view (its `transport`),
and a strong reference back made each request's cycle, its scope, events and buffers (~8 objects) a reference cycle
that only the cyclic collector could free, after the request's objects had aged into its oldest generation. An API
server then ran a full collection every ~0.5 s under load, 11-27 ms each with its event loop stopped
(docs/benchmarks.md, "The API server, step 7"); without the cycle, each request's objects go when it ends.
"""

from __future__ import annotations

import asyncio
import weakref
from typing import Any, Protocol


class Cycle(Protocol):
    """What this view reads of uvicorn's RequestResponseCycle: whether the answer has started."""

    response_started: bool


class ResponseWrites(asyncio.Transport):
    """The writes one request's cycle makes to `transport`: the first one after its answer started (the head)
    is held and joined to the next (the body's first part)."""

    __slots__ = ("_cycle", "_held", "_is_head_seen", "_transport")

    def __init__(self, transport: asyncio.Transport, cycle: Cycle):
        super().__init__()
        self._transport = transport
        self._cycle = weakref.ref(cycle)
        self._held: bytes | None = None
        self._is_head_seen = False

    def write(self, data: bytes | bytearray | memoryview[Any]) -> None:
        held = self._held
        if held is not None:
            self._held = None
            self._transport.writelines((held, data))
        elif not self._is_head_seen and self._is_started():
            # uvicorn sets response_started just before it writes the head; a `100 Continue` comes before.
            self._is_head_seen = True
            self._held = bytes(data)
        else:
            self._transport.write(data)

    def close(self) -> None:
        self._flush()
        self._transport.close()

    def abort(self) -> None:
        self._transport.abort()

    def is_closing(self) -> bool:
        return self._transport.is_closing()

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self._transport.get_extra_info(name, default)

    def _is_started(self) -> bool:
        cycle = self._cycle()
        return cycle is not None and cycle.response_started

    def _flush(self) -> None:
        if self._held is not None:
            held, self._held = self._held, None
            self._transport.write(held)
