"""Running an engine job, turning its rows back into the request's order, and the whole request cycle."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import time
from collections.abc import Callable
from typing import ParamSpec, TypeVar

import numpy as np
import numpy.typing as npt
from starlette.requests import Request
from starlette.responses import Response

from apiserver.errors import ApiError, ClientDisconnected
from apiserver.inputs.job import EngineJob, check_total_tokens
from apiserver.inputs.prepare import PreparedJob
from apiserver.metrics import IMAGES, PREPROCESS_SECONDS, PROMPT_TOKENS
from apiserver.state import AppState

F32 = npt.NDArray[np.float32]
Parsed = TypeVar("Parsed")
P = ParamSpec("P")
T = TypeVar("T")


async def preprocess(request: Request, size: int, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    """Run synchronous work of about `size` bytes on the preprocessing pool (or inline when small),
    timed for the metrics and TEI's headers."""
    state: AppState = request.app.state.poolserve
    started = time.perf_counter()
    try:
        return await state.preprocess.run(size, fn, *args, **kwargs)
    finally:
        elapsed = time.perf_counter() - started
        request.state.preprocess_s = getattr(request.state, "preprocess_s", 0.0) + elapsed
        PREPROCESS_SECONDS.labels(endpoint=request.url.path).observe(elapsed)


async def preprocess_body(request: Request, fn: Callable[[bytes, AppState], T]) -> T:
    """Decode and prepare a request body: inline when it is small, else on the pool."""
    body = await request.body()
    return await preprocess(request, len(body), fn, body, request.app.state.poolserve)


async def run_job(request: Request, job: EngineJob) -> F32:
    """The job's output rows, one per request input, in the request's order.

    The engine drops the work (an Abort) when the client disconnects or the request's deadline
    passes first: nobody would read the answer."""
    state: AppState = request.app.state.poolserve
    check_total_tokens(job, state.config.max_tokens_per_request)
    check_fits_queue(job, state)
    pool_request, frames = job.to_wire()
    work = asyncio.ensure_future(state.engine.pool(pool_request, frames))
    disconnect = asyncio.ensure_future(wait_for_disconnect(request))
    timeout = state.config.request_timeout
    remaining = timeout - (time.monotonic() - request.state.started) if timeout else None
    try:
        done, _ = await asyncio.wait((work, disconnect), timeout=remaining, return_when=asyncio.FIRST_COMPLETED)
    finally:
        disconnect.cancel()
    if work not in done:
        work.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await work
        if disconnect in done:
            raise ClientDisconnected
        raise ApiError(
            504, f"The request took longer than --request-timeout ({timeout:g}s); its work was dropped.", code="timeout"
        )
    result = work.result()
    request.state.queue_s, request.state.inference_s = result.queue_time, result.inference_time
    request.state.tokens = job.prompt_tokens
    PROMPT_TOKENS.labels(endpoint=request.url.path).inc(job.prompt_tokens)
    if job.images:
        IMAGES.labels(endpoint=request.url.path).inc(len(job.images))
    rows = np.frombuffer(result.data, dtype=result.dtype).reshape(result.rows, result.dim)
    return rows if job.order is None else rows[job.order]


async def wait_for_disconnect(request: Request) -> None:
    """Returns when the client goes away; the body was read already, so only http.disconnect can come."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


def check_fits_queue(job: EngineJob, state: AppState) -> None:
    """A request bigger than the whole queue would get 429 forever: it is a 413 instead."""
    config = state.config
    inputs = len(job.rows) + len(job.images)
    tokens = job.prompt_tokens + len(job.images) * state.card.image_tokens
    if inputs > config.max_queued_inputs or tokens > config.max_queued_tokens:
        raise ApiError(
            413,
            f"The request holds {inputs} inputs and {tokens} tokens; the server's whole queue holds "
            f"{config.max_queued_inputs} inputs and {config.max_queued_tokens} tokens. Split it.",
        )


def encode_rows(rows: F32, encoding_format: str) -> list[list[float] | str]:
    """Rows as JSON floats, or as base64 of their little-endian float32 bytes (what OpenAI's clients decode)."""
    if encoding_format == "base64":
        data = np.ascontiguousarray(rows, dtype="<f4")
        return [base64.b64encode(row.tobytes()).decode() for row in data]
    floats: list[list[float] | str] = rows.tolist()
    return floats


async def finish_job(request: Request, prepared: PreparedJob) -> EngineJob:
    """The prepared job, after fetching its remote images (on the loop) and decoding them (on the pool)."""
    if prepared.job is not None:
        return prepared.job
    state: AppState = request.app.state.poolserve
    fetched = await state.images.fetch_all(prepared.remote)
    size = sum(len(data) for data in fetched.values())
    return await preprocess(request, size, prepared.build, lambda source: state.images.load(source, fetched))


async def answer_items_request(
    request: Request,
    prepare: Callable[[bytes, AppState], tuple[Parsed, PreparedJob]],
    encode: Callable[[F32, Parsed, int, str], bytes],
) -> Response:
    """Decode and prepare on the preprocessing pool, fetch remote images, run, encode on the pool."""
    state: AppState = request.app.state.poolserve
    parsed, prepared = await preprocess_body(request, prepare)
    job = await finish_job(request, prepared)
    rows = await run_job(request, job)
    content = await preprocess(request, rows.nbytes, encode, rows, parsed, job.prompt_tokens, state.model_name)
    return Response(content, media_type="application/json")
