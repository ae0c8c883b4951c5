from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import zmq
import zmq.asyncio

from engine_client import EngineClient, EngineOverloaded, EngineUnavailable, PoisonPill
from engine_client.link import IDLE_AFTER_S, IDLE_PING_INTERVAL_S, PING_INTERVAL_S
from poolserve.protocol import EngineRequest, Pong
from tests.cards import CARD
from tests.engine_client.fake_engine import (
    FakeEngine,
    answered,
    connected_client,
    job,
    run_scenario,
    shut_down,
    two_engines,
    until,
)


def test_requests_spread_over_the_engines_and_a_dead_engine_s_work_moves_to_the_other_at_once(tmp_path: Path) -> None:
    async def scenario() -> None:
        context = zmq.asyncio.Context()
        endpoints, engines = two_engines(context, tmp_path)
        client = await connected_client(endpoints)
        work = [asyncio.ensure_future(client.pool(job())) for _ in range(4)]
        await until(lambda: len(engines[0].held) + len(engines[1].held) == 4)
        assert [len(engine.held) for engine in engines] == [2, 2]
        assert client.inputs_in_flight() == [2, 2]
        # A request of 3 inputs counts as 3: the next two singles go to the other engine.
        big = asyncio.ensure_future(client.pool(job(3)))
        await until(lambda: len(engines[0].held) + len(engines[1].held) == 5)
        assert client.inputs_in_flight() in ([5, 2], [2, 5])
        await engines[0].die()
        # Engine 0's requests reach engine 1 without waiting for a restart, marked as resubmitted: all five
        # requests are then there (waiting for fewer answered some before the last arrived: a 300 s hang in CI).
        await until(lambda: len(engines[1].held) == 5)
        moved = [request for _, request in engines[1].held if request.attempt == 1]
        assert moved and all(request.is_suspect for request in moved)
        assert client.inputs_in_flight()[0] == 0
        await engines[1].answer_all()
        results = await asyncio.gather(*work, big)
        assert all(float(result.vectors[0][0]) == 1.0 for result in results)
        assert client.in_flight == 0 and client.inputs_in_flight() == [0, 0]
        await client.close()
        await engines[1].die()
        context.term()

    run_scenario(scenario())


def test_an_engine_stuck_in_one_forward_pass_gets_no_new_request_while_another_is_not(tmp_path: Path) -> None:
    async def scenario() -> None:
        context = zmq.asyncio.Context()
        endpoints, engines = two_engines(context, tmp_path)
        engines[0].stalled_for = 60.0
        client = await connected_client(endpoints, stall_limit=10.0)
        await until(lambda: all(link.latest_pong() not in (None, Pong(-1)) for link in client.links))
        work = [asyncio.ensure_future(client.pool(job())) for _ in range(4)]
        await until(lambda: len(engines[1].held) == 4)
        assert engines[0].held == []
        await engines[1].answer_all()
        await asyncio.gather(*work)
        # When every engine is stuck, the requests go to them all the same: one may come back.
        engines[1].stalled_for = 60.0
        await asyncio.sleep(0.3)
        work = [asyncio.ensure_future(client.pool(job())) for _ in range(2)]
        await until(lambda: len(engines[0].held) == len(engines[1].held) == 1)
        for engine in engines:
            await engine.answer_all()
        await asyncio.gather(*work)
        await shut_down(client, engines, context)

    run_scenario(scenario())


def test_a_request_in_two_dying_forward_passes_of_two_engines_is_failed_and_its_neighbours_are_not(
    tmp_path: Path,
) -> None:
    async def scenario() -> None:
        context = zmq.asyncio.Context()
        endpoints, engines = two_engines(context, tmp_path)
        client = await connected_client(endpoints)
        work = [asyncio.ensure_future(client.pool(job())) for _ in range(2)]
        await until(lambda: len(engines[0].held) + len(engines[1].held) == 2)
        [(_, pill)] = engines[0].held
        # Engine 0 dies with the pill in its forward pass; it moves to engine 1, which dies of it too.
        await engines[0].die()
        await until(lambda: any(request.id == pill.id for _, request in engines[1].held))
        await engines[1].die()
        # Both come back naming it: the second naming fails it; the other request is sent again.
        engines = [FakeEngine(context, endpoints[0], 0, suspects=[pill.id])]
        await until(lambda: client.links[0].is_ready)
        engines.append(FakeEngine(context, endpoints[1], 1, suspects=[pill.id]))
        await until(work[pill.id].done)
        assert isinstance(work[pill.id].exception(), PoisonPill)
        innocent = await answered(work[1 - pill.id], engines)
        assert innocent.vectors.shape == (1, CARD.output_size)
        await shut_down(client, engines, context)

    run_scenario(scenario())


def test_a_send_refused_before_the_disconnect_is_seen_keeps_the_request_for_the_next_engine(tmp_path: Path) -> None:
    """The engine just died: ZeroMQ refuses the send while the monitor has not said so yet."""

    async def scenario() -> tuple[int, bool]:
        client = EngineClient([f"ipc://{tmp_path}/nobody.sock"], 0)
        link = client.links[0]
        link.ready.set()  # as it was the moment before the engine died
        client._any_ready.set()
        work = asyncio.ensure_future(client.pool(EngineRequest.from_rows([[1]])))
        await asyncio.sleep(0.05)
        in_flight_while_refused = client.in_flight
        link.ready.clear()  # the disconnect arrives
        await client.on_lost(link)
        await asyncio.sleep(0.05)
        is_waiting = not work.done()
        work.cancel()
        await client.close()
        return in_flight_while_refused, is_waiting

    in_flight, is_waiting = run_scenario(scenario())
    assert in_flight == 1
    assert is_waiting  # for the restarted engine's Ready, not failed with 503


def test_a_request_an_engine_has_no_room_for_goes_to_another_and_is_refused_only_when_every_engine_is_full(
    tmp_path: Path,
) -> None:
    """One admission limit for the whole server: each engine admits its share, so a full engine's refusal
    is not yet the server's (engine_core/admission.py)."""

    async def scenario() -> None:
        context = zmq.asyncio.Context()
        endpoints, engines = two_engines(context, tmp_path)
        client = await connected_client(endpoints)
        engines[0].is_full = True
        work = [asyncio.ensure_future(client.pool(job())) for _ in range(4)]
        await until(lambda: len(engines[1].held) == 4)
        assert engines[0].refused == 2  # round robin sent it half; each went on to engine 1, not admitted there
        assert all(request.attempt == 0 for _, request in engines[1].held)
        assert client.inputs_in_flight() == [0, 4]
        await engines[1].answer_all()
        assert all(float(result.vectors[0][0]) == 1.0 for result in await asyncio.gather(*work))
        engines[1].is_full = True
        try:
            await client.pool(job())
        except EngineOverloaded:
            pass
        else:
            raise AssertionError("a request every engine refused was not refused")
        assert engines[0].refused + engines[1].refused == 4  # each engine was asked once
        assert client.in_flight == 0 and client.inputs_in_flight() == [0, 0]
        await shut_down(client, engines, context)

    run_scenario(scenario())


def test_requests_go_to_the_engine_whose_pongs_count_fewer_waiting_inputs(tmp_path: Path) -> None:
    """Another API server's work shows only in the engines' pongs: engine 0 holds 50 inputs from others,
    so this API server's next requests go to engine 1 although it has nothing in flight on either."""

    async def scenario() -> None:
        context = zmq.asyncio.Context()
        endpoints, engines = two_engines(context, tmp_path)
        engines[0].queued_inputs = 50
        client = await connected_client(endpoints)
        await until(lambda: all(link.latest_pong() not in (None, Pong(-1)) for link in client.links))
        work = [asyncio.ensure_future(client.pool(job())) for _ in range(6)]
        await until(lambda: len(engines[0].held) + len(engines[1].held) == 6)
        assert [len(engine.held) for engine in engines] == [0, 6]
        for engine in engines:
            await engine.answer_all()
        await asyncio.gather(*work)
        await shut_down(client, engines, context)

    run_scenario(scenario())


def test_once_the_api_server_stops_waiting_for_its_lost_engine_a_request_that_waits_or_comes_later_fails_at_once(
    tmp_path: Path,
) -> None:
    """A stopping API server whose engine died (the supervisor starts none while it stops) fails what waits for one
    (apiserver/process.py's fail_waiting_on_exit). A request that came in after the engine was lost waited for one
    the whole `wait_timeout` (30 s) instead: the drain, and the whole launch's stop, held open that long."""

    async def scenario() -> None:
        context = zmq.asyncio.Context()
        endpoint = f"ipc://{tmp_path}/engine.sock"
        engine = FakeEngine(context, endpoint, 0)
        client = await connected_client([endpoint], wait_timeout=30)
        held = asyncio.ensure_future(client.pool(job()))
        await until(lambda: len(engine.held) == 1)
        await engine.die()
        await until(lambda: not client.is_ready)
        late = asyncio.ensure_future(client.pool(job()))
        await asyncio.sleep(0.1)
        assert not held.done() and not late.done()  # both wait for the engine to come back, as they should
        client.fail_waiting("the API server is stopping and no engine is running")
        for waiting in (held, late):
            with pytest.raises(EngineUnavailable, match="stopping and no engine"):
                await asyncio.wait_for(waiting, 1)
        # and one that comes later still
        with pytest.raises(EngineUnavailable, match="stopping and no engine"):
            await asyncio.wait_for(client.pool(job()), 1)
        await client.close()
        context.term()

    run_scenario(scenario())


def test_a_link_s_pinger_cancelled_in_the_turn_its_pong_lands_stops_and_the_client_closes(tmp_path: Path) -> None:
    """Python 3.11's asyncio.wait_for returns its future's result, and drops the cancellation, when both land in one
    turn of the loop: the pinger then pinged on, the link's close() awaited it for ever, and a stopping API server
    (one in 8 runs of the several-models tests) was killed by the supervisor 35 s later. Here the pong and the
    cancel land together every time."""

    async def scenario() -> None:
        context = zmq.asyncio.Context()
        endpoint = f"ipc://{tmp_path}/engine.sock"
        engine = FakeEngine(context, endpoint, 0)
        client = await connected_client([endpoint])
        link = client.links[0]
        engine.answers_pings = False
        pinger = next(task for task in link._tasks if task.get_name().endswith("-pinger"))
        await until(lambda: bool(link._pings))
        for pending in list(link._pings.values()):
            pending.set_result(Pong(-1))
        pinger.cancel()
        await asyncio.wait({pinger}, timeout=1)
        assert pinger.cancelled(), "the pinger went on after its cancellation"
        await asyncio.wait_for(client.close(), 2)
        await engine.die()
        context.term()

    run_scenario(scenario())


def test_an_idle_link_pings_its_engine_twice_a_second_and_a_request_brings_back_ten(tmp_path: Path) -> None:
    """Idle, an API server pings its engine every IDLE_PING_INTERVAL_S (/health needs an answer within PONG_STALE_S);
    a request wakes the pinger at once, and while it has work the pings come every PING_INTERVAL_S."""

    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        context = zmq.asyncio.Context()
        endpoint = f"ipc://{tmp_path}/engine.sock"
        engine = FakeEngine(context, endpoint, 0)
        client = await connected_client([endpoint])
        await asyncio.sleep(IDLE_AFTER_S)

        def pings_since(start: float) -> int:
            return sum(at >= start for at in engine.pinged_at)

        idle_from = loop.time()
        await asyncio.sleep(1.5)
        assert pings_since(idle_from) <= 1.5 / IDLE_PING_INTERVAL_S + 1, engine.pinged_at
        assert pings_since(idle_from) >= 1  # the engine is still asked whether it is there
        held = asyncio.ensure_future(client.pool(job()))
        await until(lambda: len(engine.held) == 1)
        sent_at = loop.time()
        await until(lambda: pings_since(sent_at) >= 1, timeout=IDLE_PING_INTERVAL_S / 2)  # woken, not at its timer
        await asyncio.sleep(1.0)
        assert pings_since(sent_at) >= 0.5 / PING_INTERVAL_S, engine.pinged_at
        await engine.answer_all()
        await asyncio.wait_for(held, 2)
        assert client.links[0].latest_pong() is not None
        await shut_down(client, [engine], context)

    run_scenario(scenario())
