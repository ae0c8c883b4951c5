"""The limits every engine job meets before it is sent, whichever endpoint (or plugin) built it: what a
request holds in all, once its inputs are tokenized (apiserver/requests/limits.py holds the limits themselves)."""

from __future__ import annotations

from apiserver.errors import ApiError
from apiserver.requests.inputs.job import EngineJob
from apiserver.requests.limits import MAX_TOKEN_STATE_VALUES, check_image_count, over_limit, token_budget
from poolserve.config import Config
from poolserve.model_card import ModelCard


def check_job(job: EngineJob, config: Config, card: ModelCard) -> None:
    """The limits every engine job meets before it is sent, whichever endpoint (or plugin) built it."""
    check_image_count(len(job.images), config.max_images_per_request)
    token_budget(config).check(job.prompt_tokens)
    check_token_states(job, card)
    check_fits_queue(job, config, card)


def check_fits_queue(job: EngineJob, config: Config, card: ModelCard) -> None:
    """A request bigger than the engine's whole queue would get 429 forever: it is a 413 instead. The queue is the
    model's: with several models each has its own engines and limits."""
    inputs = len(job.rows) + len(job.images)
    tokens = job.prompt_tokens + len(job.images) * card.image_tokens
    if inputs > config.max_queued_inputs or tokens > config.max_queued_tokens:
        raise ApiError(
            413,
            f"This request has {inputs} inputs and {tokens} tokens, more than the whole queue of the model "
            f"{config.model_names[0]!r} holds: "
            f"{config.max_queued_inputs} inputs and {config.max_queued_tokens} tokens "
            "(--max-queued-inputs, --max-queued-tokens). Split it.",
        )


def check_token_states(job: EngineJob, card: ModelCard) -> None:
    if job.params.per_token and job.prompt_tokens * card.output_size > MAX_TOKEN_STATE_VALUES:
        limit = MAX_TOKEN_STATE_VALUES // card.output_size
        raise over_limit(
            "This request", job.prompt_tokens, "tokens", limit, f"every token's {card.output_size} values back",
            param=None, code="too_many_tokens",
        )  # fmt: skip
