"""Every per-request limit the API server enforces, in one message style: what the request holds,
the limit, and the flag that sets it ("... more than this server's limit of N per request (--flag).").

The body-size limit is checked before a byte is read (body_limit.py); the count of inputs before
any is tokenized (by each endpoint's parse, which knows the field that holds them); images before
any is fetched; tokens and the queue once the job is built, before it goes to the engine.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from apiserver.errors import ApiError

if TYPE_CHECKING:  # inputs/ checks its counts here: a run-time import would be circular
    from apiserver.inputs.job import EngineJob
    from poolserve.config import Config
    from poolserve.protocol import ModelCard


def over_limit(subject: str, count: int, unit: str, limit: int, flag: str, *, param: str | None, code: str) -> ApiError:
    return ApiError(
        400,
        f"{subject} has {count} {unit}, more than this server's limit of {limit} per request ({flag}).",
        param=param,
        code=code,
    )


def check_input_count(count: int, limit: int, param: str) -> None:
    """--max-inputs-per-request, whatever an endpoint calls its inputs (texts, pairs, documents, items)."""
    if count > limit:
        raise over_limit(
            f"`{param}`", count, "inputs", limit, "--max-inputs-per-request", param=param, code="too_many_inputs"
        )


def check_image_count(count: int, limit: int, param: str = "input") -> None:
    """--max-images-per-request: checked before any image is fetched or decoded."""
    if count > limit:
        raise over_limit(
            "This request", count, "images", limit, "--max-images-per-request", param=param, code="too_many_images"
        )


def check_total_tokens(job: EngineJob, limit: int) -> None:
    """--max-tokens-per-request: what one request may ask of the model, counted as sent (after truncation)."""
    tokens = job.prompt_tokens
    if tokens > limit:
        raise over_limit(
            "This request", tokens, "tokens", limit, "--max-tokens-per-request", param=None, code="too_many_tokens"
        )


def check_fits_queue(job: EngineJob, config: Config, card: ModelCard) -> None:
    """A request bigger than the engine's whole queue would get 429 forever: it is a 413 instead."""
    inputs = len(job.rows) + len(job.images)
    tokens = job.prompt_tokens + len(job.images) * card.image_tokens
    if inputs > config.max_queued_inputs or tokens > config.max_queued_tokens:
        raise ApiError(
            413,
            f"This request has {inputs} inputs and {tokens} tokens, more than the server's whole queue holds: "
            f"{config.max_queued_inputs} inputs and {config.max_queued_tokens} tokens "
            "(--max-queued-inputs, --max-queued-tokens). Split it.",
        )


def check_job(job: EngineJob, config: Config, card: ModelCard) -> None:
    """The limits every engine job meets before it is sent, whichever endpoint (or plugin) built it."""
    check_image_count(len(job.images), config.max_images_per_request)
    check_total_tokens(job, config.max_tokens_per_request)
    check_fits_queue(job, config, card)


def body_too_large(limit: int, size: int | None = None) -> ApiError:
    """--max-request-bytes, said in bytes of body rather than per request."""
    said = f" ({size} bytes)" if size is not None else ""
    return ApiError(
        413,
        f"The request body is larger{said} than this server's limit of {limit} bytes (--max-request-bytes).",
        code="request_too_large",
    )
