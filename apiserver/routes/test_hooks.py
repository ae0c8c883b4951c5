"""Routes that exist only when tests ask (POOLSERVE_TEST_HOOKS=1), to look inside a live process."""

from __future__ import annotations

import os
import sys
import time

import msgspec
from starlette.requests import Request
from starlette.responses import Response


async def loaded_modules(request: Request) -> Response:
    body = {"pid": os.getpid(), "modules": sorted(sys.modules)}
    return Response(msgspec.json.encode(body), media_type="application/json")


async def block_event_loop(request: Request) -> Response:
    """Blocks this process's event loop (not a thread) for `seconds`: a hung API server."""
    seconds = float(request.query_params.get("seconds", "60"))
    time.sleep(seconds)
    return Response(b"{}", media_type="application/json")
