"""The engine client's side of the batched wire: what one event-loop turn sends, and what one reply settles."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import zmq.asyncio

from engine_client import EngineClient, EngineError, EngineOverloaded
from engine_client.client import PooledResult
from tests.cards import CARD
from tests.engine_client.fake_engine import FakeEngine, connected_client, job, until


async def one_engine(tmp_path: Path) -> tuple[zmq.asyncio.Context, FakeEngine, EngineClient]:
    context = zmq.asyncio.Context()
    endpoint = f"ipc://{tmp_path}/engine-0.sock"
    engine = FakeEngine(context, endpoint, 0)
    return context, engine, await connected_client([endpoint])


async def close(context: zmq.asyncio.Context, engine: FakeEngine, client: EngineClient) -> None:
    await client.close()
    await engine.die()
    context.term()


def test_the_requests_of_one_turn_reach_the_engine_as_one_message_and_one_reply_settles_them_all(
    tmp_path: Path,
) -> None:
    async def scenario() -> None:
        context, engine, client = await one_engine(tmp_path)
        work = [asyncio.ensure_future(client.pool(job(inputs))) for inputs in (1, 3, 2, 1, 1)]
        await until(lambda: len(engine.held) == 5)
        assert engine.messages == 1
        assert [len(request.lengths) for _, request in engine.held] == [1, 3, 2, 1, 1]
        # Each request's rows are its own: the reply's one frame is cut at the right places.
        await engine.answer_all(fill=lambda request: 10.0 + request.id)
        results: list[PooledResult] = await asyncio.gather(*work)
        for result, request_id, inputs in zip(results, range(5), (1, 3, 2, 1, 1), strict=True):
            assert result.vectors.shape == (inputs, CARD.output_size)
            assert (result.vectors == 10.0 + request_id).all()
        # A later turn's requests go in a message of their own.
        more = [asyncio.ensure_future(client.pool(job())) for _ in range(2)]
        await until(lambda: len(engine.held) == 2)
        assert engine.messages == 2
        await engine.answer_all()
        await asyncio.gather(*more)
        assert client.in_flight == 0
        await close(context, engine, client)

    asyncio.run(scenario())


def test_one_failed_request_among_several_in_one_reply_fails_alone(tmp_path: Path) -> None:
    async def scenario() -> None:
        context, engine, client = await one_engine(tmp_path)
        work = [asyncio.ensure_future(client.pool(job())) for _ in range(3)]
        await until(lambda: len(engine.held) == 3)
        ids = [request.id for _, request in engine.held]
        await engine.answer_all(fill=lambda request: float(request.id), failing={ids[1]})
        first, second, third = await asyncio.gather(*work, return_exceptions=True)
        assert isinstance(second, EngineError) and str(second) == "it failed"
        assert isinstance(first, PooledResult) and isinstance(third, PooledResult)
        assert (first.vectors == ids[0]).all() and (third.vectors == ids[2]).all()
        assert client.in_flight == 0
        await close(context, engine, client)

    asyncio.run(scenario())


def test_a_cancelled_request_among_several_is_aborted_alone_and_the_others_are_answered(tmp_path: Path) -> None:
    async def scenario() -> None:
        context, engine, client = await one_engine(tmp_path)
        work = [asyncio.ensure_future(client.pool(job())) for _ in range(4)]
        await until(lambda: len(engine.held) == 4)
        gone = [engine.held[1][1].id, engine.held[3][1].id]
        work[1].cancel()
        work[3].cancel()
        # Both aborts go in the one message of that turn, which carries no request.
        await until(lambda: len(engine.aborted) == 2)
        assert sorted(engine.aborted) == sorted(gone) and engine.messages == 2
        assert sorted(request.id for _, request in engine.held) == sorted({0, 1, 2, 3} - set(gone))
        await engine.answer_all()
        await asyncio.gather(work[0], work[2])
        for cancelled in (work[1], work[3]):
            with pytest.raises(asyncio.CancelledError):
                await cancelled
        assert client.in_flight == 0
        await close(context, engine, client)

    asyncio.run(scenario())


def test_with_one_engine_a_request_it_has_no_room_for_is_refused_and_the_next_goes_to_it(tmp_path: Path) -> None:
    async def scenario() -> None:
        context, engine, client = await one_engine(tmp_path)
        engine.is_full = True
        refused = await asyncio.gather(*(client.pool(job()) for _ in range(2)), return_exceptions=True)
        assert all(isinstance(error, EngineOverloaded) for error in refused) and engine.refused == 2
        engine.is_full = False
        work = asyncio.ensure_future(client.pool(job()))
        await until(lambda: len(engine.held) == 1)
        await engine.answer_all()
        assert (await work).vectors.shape == (1, CARD.output_size)
        assert client.in_flight == 0 and client.inputs_in_flight() == [0]
        await close(context, engine, client)

    asyncio.run(scenario())
