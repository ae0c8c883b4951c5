"""The one way a request that does work is answered: parse, fetch images, run the engine, render.

Parse and render are synchronous and run on the preprocessing pool (inline when small), so the
event loop stays free for /health and for other connections; only waiting runs on the loop:
remote image fetches, an async parse's own I/O, and the engine. Parsing (decoding, tokenizing,
decoding images) and rendering (encoding the answer) are timed apart: `x-tokenization-time` and
`x-encoding-time`, and two histograms (docs/metrics.md). Parsing goes by one name here (PARSING, its state field
`parse_s`, its span `parse`, its histogram PARSE_SECONDS); what clients and scrapes read keeps its published name
(TEI's `x-tokenization-time`, `poolserve_preprocess_duration_seconds`). Both run on the preprocessing pool
(preprocess.py's Preprocessor, --preprocess-workers), which is where, not what.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, ParamSpec, TypeVar

import msgspec
from prometheus_client import Histogram
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response

from apiserver.connection import client_gone
from apiserver.connection.gate import Handler
from apiserver.connection.tracing import TRACE_SPAN
from apiserver.errors import ERROR_STYLE, ApiError, ClientDisconnected, ErrorStyle
from apiserver.metrics import ENCODE_SECONDS, IMAGES, MODEL, PARSE_SECONDS, PROMPT_TOKENS, series
from apiserver.requests.inputs.job import EngineJob
from apiserver.requests.inputs.job_limits import check_job
from apiserver.requests.limits import check_image_count, check_priority
from apiserver.requests.operation import NO_ROWS, AnyOperation, Plan, Rows
from apiserver.requests.preprocess import Preprocessor
from apiserver.requests.responses import JsonAnswer
from apiserver.requests.served_models import ServedModels
from apiserver.requests.state import AppState
from apiserver.requests.validation import decode_body
from poolserve.protocol import SparseRows

P = ParamSpec("P")
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Timer:
    """Where time off the loop is added up: a field of the request's state (read by the gate's
    timing headers), a histogram by endpoint, and a traced request's child span of this name."""

    field: str
    histogram: Histogram
    span: str


PARSING = Timer("parse_s", PARSE_SECONDS, "parse")  # x-tokenization-time
ENCODING = Timer("encode_s", ENCODE_SECONDS, "render")  # x-encoding-time


def handler_of(operation: AnyOperation) -> Handler:
    """The Starlette endpoint that answers `operation`'s requests; its body decoder is built once."""
    decoder = msgspec.json.Decoder(operation.request)

    async def handle(request: Request) -> Response:
        return await answer(request, operation, decoder)

    return handle


async def answer(request: Request, operation: AnyOperation, decoder: msgspec.json.Decoder[Any]) -> Response:
    models: ServedModels = request.app.state.models
    body = await read_body(request)
    decoded, style, parsed, state = await off_loop(
        request, PARSING, len(body), parse_body, body, decoder, operation, models, request.scope["state"]
    )
    if style is not None:  # what fails from here on (the engine, a timeout) answers in the body's style
        setattr(request.state, ERROR_STYLE, style)
    if inspect.isawaitable(parsed):
        started = time.perf_counter()
        try:
            parsed = await parsed
        finally:
            add_time(request, PARSING, time.perf_counter() - started)
    plan: Plan[Any] = parsed
    user = getattr(decoded, "user", None)
    if user is not None:  # OpenAI's end-user id: the access log shows it beside the request id
        request.state.user = user
    # Every request type that reaches the engine has vLLM's `priority` (a plugin's may not): it goes into the engine
    # request as run_job builds it.
    priority: int = getattr(decoded, "priority", 0)
    check_priority(priority, state.config)
    # A job that needs no remote images is built already: no coroutine for it.
    job = plan.job if plan.job is not None or plan.build is None else await job_of(request, plan, state)
    span = request.scope["state"].get(TRACE_SPAN)
    if span is not None:
        span.set_attributes(
            {
                "http.route": request.scope["path"],
                "poolserve.model": state.model_name,
                "poolserve.inputs": 0 if job is None else len(job.rows) + len(job.images),
                "poolserve.tokens": 0 if job is None else job.prompt_tokens,
            }
        )
    output = NO_ROWS if job is None else await run_job(request, job, state, priority)
    rows = rows_for(operation, plan, output)
    size = rows.nbytes or (0 if plan.sparse is None else plan.sparse.values.nbytes * 4)
    # A plan with no rows (tokenize) renders what parse made, about as big as the body was.
    content = await off_loop(request, ENCODING, size or len(body), operation.render, plan, rows, state)
    return JsonAnswer(content)


async def read_body(request: Request) -> bytes:
    """The whole body, read as Starlette's `request.body()` reads it but without its async generator."""
    chunks = []
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            raise ClientDisconnect
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def rows_for(operation: AnyOperation, plan: Plan[Any], output: Rows | SparseRows) -> Rows:
    """The dense rows render gets; a sparse model's rows go in `plan.sparse` for an operation that takes them,
    and are made dense (every vocabulary entry) for one that does not."""
    if not isinstance(output, SparseRows):
        return output
    if operation.takes_sparse:
        plan.sparse = output
        return NO_ROWS
    return output.to_dense()


def parse_body(
    body: bytes,
    decoder: msgspec.json.Decoder[Any],
    operation: AnyOperation,
    models: ServedModels,
    scope_state: dict[str, Any],
) -> tuple[Any, ErrorStyle | None, Plan[Any] | Awaitable[Plan[Any]], AppState]:
    """The decoded request, the error style its body asks for, its plan, and the model that answers it (the one
    its `model` field names; a body without one, the default), named in `scope_state` for the request's metrics
    from then on; an async parse only creates its coroutine here, to be awaited on the loop."""
    decoded = decode_body(body, decoder)
    style = None if operation.error_style is None else operation.error_style(decoded)
    try:
        state = models.pick(getattr(decoded, "model", None))
        scope_state[MODEL] = state.model_name
        return decoded, style, operation.parse(decoded, state), state
    except ApiError as exc:
        exc.style = exc.style or style
        raise


async def off_loop(
    request: Request, timer: Timer, size: int, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs
) -> T:
    """Run synchronous work of about `size` bytes on the preprocessing pool (or inline when small), its
    time added up by `timer`."""
    preprocess: Preprocessor = request.app.state.poolserve.preprocess
    started = time.perf_counter()
    try:
        if preprocess.is_inline(size):  # most requests: no coroutine of the pool's to create and await
            return fn(*args, **kwargs)
        return await preprocess.run(size, fn, *args, **kwargs)
    finally:
        add_time(request, timer, time.perf_counter() - started)


def add_time(request: Request, timer: Timer, elapsed: float) -> None:
    state = request.scope["state"]
    state[timer.field] = state.get(timer.field, 0.0) + elapsed
    series(timer.histogram, request.scope["path"], state.get(MODEL, "")).observe(elapsed)
    span = state.get(TRACE_SPAN)
    if span is not None:
        tracer = request.app.state.poolserve.tracer
        tracer.add_step(span, timer.span, elapsed)


async def job_of(request: Request, plan: Plan[Any], state: AppState) -> EngineJob | None:
    """The plan's job, after fetching its remote images (on the loop) and building it from them (on the pool)."""
    if plan.job is not None or plan.build is None:
        return plan.job
    check_image_count(len(plan.remote), state.config.max_images_per_request)
    fetched = await state.images.fetch_all(plan.remote)
    size = sum(len(data) for data in fetched.values())
    plan.job = await off_loop(request, PARSING, size, plan.build, lambda s: state.images.load(s, fetched))
    return plan.job


async def run_job(request: Request, job: EngineJob, state: AppState, priority: int) -> Rows | SparseRows:
    """The job's output rows, one per request input, in the request's order, from `state`'s model's engines.

    The engine drops the work (an Abort) when the client disconnects or the request's deadline
    passes first: nobody would read the answer. Both cancel this task while it waits
    (apiserver/connection/client_gone.py, asyncio.timeout)."""
    check_job(job, state.config, state.card)
    timeout = state.config.request_timeout
    scope_state = request.scope["state"]
    remaining = timeout - (time.monotonic() - scope_state["started"]) if timeout else None
    if not client_gone.watch(scope_state):
        raise ClientDisconnected
    span = scope_state.get(TRACE_SPAN)
    try:
        async with asyncio.timeout(remaining):
            result = await state.engine.pool(job.to_wire(priority=priority, traced=span is not None))
    except TimeoutError:
        raise ApiError(
            504, f"The request took longer than --request-timeout ({timeout:g}s); its work was dropped.", code="timeout"
        ) from None
    except asyncio.CancelledError:
        if not client_gone.is_gone(scope_state):
            raise
        current = asyncio.current_task()
        if current is not None:
            current.uncancel()
        raise ClientDisconnected from None
    finally:
        client_gone.unwatch(scope_state)
    # The request's state dict itself: Starlette's `request.state` would make each write a __setattr__ call.
    scope_state["queue_s"], scope_state["inference_s"] = result.queue_time, result.inference_time
    scope_state["tokens"] = job.prompt_tokens
    scope_state["cached"] = result.cached
    path = request.scope["path"]
    series(PROMPT_TOKENS, path, state.model_name).inc(job.prompt_tokens)
    if job.images:
        series(IMAGES, path, state.model_name).inc(len(job.images))
    if span is not None and state.tracer is not None:
        span.set_attribute("poolserve.cached_inputs", result.cached)
        state.tracer.add_engine(span, result.queue_time, result.passes or ())
    rows = result.vectors
    if isinstance(rows, SparseRows):  # a sparse model takes texts only: its rows are in the request's order
        return rows
    if job.windows is not None:  # one row per input again, from its windows' (apiserver/requests/inputs/windows.py)
        rows = job.windows.mean(rows)
    return rows if job.order is None else rows[job.order]
