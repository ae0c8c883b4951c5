"""Suspects with several engines: a poison pill is blamed at its first engine loss and never reaches a healthy engine
at once; every request, innocent or not, gets an answer or an error, also when the last engine dies."""

from __future__ import annotations

import asyncio
from pathlib import Path

import zmq
import zmq.asyncio

from engine_client import EngineClient, PoisonPill, PooledResult
from tests.engine_client.fake_engine import (
    FakeEngine,
    connected_client,
    job,
    run_scenario,
    shut_down,
    two_engines,
    until,
)


def records(folder: Path) -> list[Path]:
    return [folder / f"engine-{index}-flight" for index in range(2)]


async def sent_to_engine_0(
    client: EngineClient, engines: list[FakeEngine], count: int
) -> list[asyncio.Future[PooledResult]]:
    """`count` requests, all on engine 0 (engine 1 refuses them while full)."""
    engines[1].is_full = True
    work = [asyncio.ensure_future(client.pool(job())) for _ in range(count)]
    await until(lambda: len(engines[0].held) == count)
    engines[1].is_full = False
    return work


def test_a_pill_and_its_batch_mates_wait_for_their_own_engine_while_its_queue_moves_to_the_healthy_one(
    tmp_path: Path,
) -> None:
    async def scenario() -> None:
        context = zmq.asyncio.Context()
        endpoints, engines = two_engines(context, tmp_path)
        flight = records(tmp_path)
        client = await connected_client(endpoints, [str(path) for path in flight])
        work = await sent_to_engine_0(client, engines, 3)
        pill, mate, queued = engines[0].ids()
        # Engine 0 dies in a forward pass of the pill and one innocent request; the third was only queued.
        await engines[0].die_running(flight[0], [pill, mate])
        await until(lambda: queued in engines[1].ids())
        assert not engines[1].request(queued).is_suspect  # batched as any request
        await asyncio.sleep(0.2)
        # Blamed at the first loss: neither suspect was sent to the healthy engine.
        assert engines[1].ids() == [queued]
        await engines[1].answer_all()
        assert float((await work[queued]).vectors[0][0]) == 1.0
        # Engine 0 is back: both suspects go to it, each to run alone; the pill kills it again, alone in its pass.
        engines[0] = FakeEngine(context, endpoints[0], 0)
        await until(lambda: sorted(engines[0].ids()) == [pill, mate])
        assert all(request.is_suspect for _, request in engines[0].held)
        await engines[0].die_running(flight[0], [pill])
        await until(work[pill].done)
        assert isinstance(work[pill].exception(), PoisonPill)
        # Its batch-mate had not run yet: still a suspect, it waits for engine 0 again rather than go to engine 1.
        await asyncio.sleep(0.2)
        assert engines[1].ids() == [] and not work[mate].done()
        engines[0] = FakeEngine(context, endpoints[0], 0)
        await until(lambda: engines[0].ids() == [mate])
        await engines[0].answer_all()
        assert float((await work[mate]).vectors[0][0]) == 0.0
        assert client.in_flight == 0 and client.inputs_in_flight() == [0, 0]
        await shut_down(client, engines, context)

    run_scenario(scenario())


def test_after_the_last_engine_dies_every_request_gets_an_answer_or_an_error(tmp_path: Path) -> None:
    """Both engines die with suspects in their passes; engine 0 never comes back. Engine 1's restart takes its own
    suspect and the queued request at once, and engine 0's suspects after --engine-start-timeout, each alone."""

    async def scenario() -> None:
        context = zmq.asyncio.Context()
        endpoints, engines = two_engines(context, tmp_path)
        flight = records(tmp_path)
        client = await connected_client(endpoints, [str(path) for path in flight], suspect_wait=0.5)
        work = await sent_to_engine_0(client, engines, 2)
        pill, mate = engines[0].ids()
        await engines[0].die_running(flight[0], [pill, mate])
        await asyncio.sleep(0.05)
        others = [asyncio.ensure_future(client.pool(job())) for _ in range(2)]
        await until(lambda: len(engines[1].held) == 2)
        running, queued = engines[1].ids()
        # The last engine dies (a kill -9) with one innocent request in its pass and one queued.
        await engines[1].die_running(flight[1], [running])
        await asyncio.sleep(0.05)
        assert not client.is_ready
        engines[1] = FakeEngine(context, endpoints[1], 1)
        await until(lambda: sorted(engines[1].ids()) == sorted([running, queued]))
        assert engines[1].request(running).is_suspect and not engines[1].request(queued).is_suspect
        await engines[1].answer_all()
        await asyncio.gather(*others)
        # Engine 0 does not come back: its suspects go to engine 1 after the wait, and the pill kills it.
        await until(lambda: sorted(engines[1].ids()) == sorted([pill, mate]), timeout=3)
        assert all(request.is_suspect for _, request in engines[1].held)
        await engines[1].die_running(flight[1], [pill])
        await until(work[pill].done)
        assert isinstance(work[pill].exception(), PoisonPill)
        engines[1] = FakeEngine(context, endpoints[1], 1)
        await until(lambda: engines[1].ids() == [mate], timeout=3)
        await engines[1].answer_all()
        await work[mate]
        assert client.in_flight == 0
        await shut_down(client, engines[1:], context)

    run_scenario(scenario())


def test_suspects_of_an_engine_taken_out_of_service_go_to_another_alone_without_waiting_for_it(tmp_path: Path) -> None:
    """A crash-looping engine is out of service for minutes: its suspects do not wait that long (the supervisor
    says so on the load board; here a set stands for it)."""

    async def scenario() -> None:
        context = zmq.asyncio.Context()
        endpoints, engines = two_engines(context, tmp_path)
        flight = records(tmp_path)
        out: set[int] = set()
        client = EngineClient(
            endpoints, 0, flight_records=[str(path) for path in flight], is_out_of_service=out.__contains__
        )
        await client.connect(2)
        await until(lambda: all(link.is_ready for link in client.links))
        work = await sent_to_engine_0(client, engines, 2)
        await engines[0].die_running(flight[0], engines[0].ids())
        await asyncio.sleep(1.5)
        assert engines[1].ids() == []  # held for engine 0's restart
        out.add(0)
        await until(lambda: len(engines[1].held) == 2, timeout=3)
        assert all(request.is_suspect for _, request in engines[1].held)
        await engines[1].answer_all()
        await asyncio.gather(*work)
        await shut_down(client, engines[1:], context)

    run_scenario(scenario())
