"""apiserver/process.py's guard over a drain (`fail_waiting_on_exit`), on the engine client's real wire to a fake engine
that holds what it is sent and answers nothing, as a hung one does."""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace
from typing import cast

import pytest
import uvicorn
import zmq.asyncio

from apiserver.process import fail_waiting_on_exit
from engine_client import EngineUnavailable
from tests.engine_client.fake_engine import FakeEngine, connected_client, job, shut_down, until


def test_a_request_its_engine_holds_through_the_drain_gets_its_503_shortly_before_the_shutdown_timeout(
    tmp_path: Path,
) -> None:
    """At --shutdown-timeout uvicorn cancels what is left, and such a request's client read a bare `500 Internal
    Server Error` (no API's error shape) while the log took a traceback; the guard answers it first."""

    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        context = zmq.asyncio.Context()
        endpoint = f"ipc://{tmp_path}/engine.sock"
        engine = FakeEngine(context, endpoint, 0)
        client = await connected_client([endpoint])
        server = SimpleNamespace(should_exit=False)
        guard = asyncio.ensure_future(fail_waiting_on_exit(cast(uvicorn.Server, server), [client], 1))
        held = asyncio.ensure_future(client.pool(job()))
        await until(lambda: len(engine.held) == 1)
        await asyncio.sleep(0.3)
        assert not held.done()  # serving: the guard leaves a slow engine's requests alone
        server.should_exit = True
        asked = loop.time()
        with pytest.raises(EngineUnavailable, match=r"did not finish within --shutdown-timeout \(1s\)"):
            await asyncio.wait_for(held, 3)
        # Not at once: the drain gives it its time, less the half second the 503 needs to go out before uvicorn's
        # cancel (the upper bound leaves a loaded host room; the margin itself is apiserver/process.py's).
        assert 0.4 <= loop.time() - asked < 1.5
        guard.cancel()
        await shut_down(client, [engine], context)

    asyncio.run(scenario())
