from __future__ import annotations

import asyncio
from pathlib import Path

from engine_client import EngineClient
from poolserve.protocol import PoolJob


def test_a_send_refused_before_the_disconnect_is_seen_keeps_the_request_for_the_next_engine(tmp_path: Path) -> None:
    """The engine just died: ZeroMQ refuses the send while the monitor has not said so yet."""

    async def scenario() -> tuple[int, bool]:
        client = EngineClient(f"ipc://{tmp_path}/nobody.sock", 0)
        client._ready.set()  # as it was the moment before the engine died
        work = asyncio.ensure_future(client.pool(PoolJob.from_rows([[1]])))
        await asyncio.sleep(0.05)
        in_flight_while_refused = client.in_flight
        client._ready.clear()  # the disconnect arrives
        await asyncio.sleep(0.05)
        is_waiting = not work.done()
        work.cancel()
        await client.close()
        return in_flight_while_refused, is_waiting

    in_flight, is_waiting = asyncio.run(scenario())
    assert in_flight == 1
    assert is_waiting  # for the restarted engine's Ready, not failed with 503
