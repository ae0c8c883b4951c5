"""Every per-request limit the API server enforces, in one message style: what the request holds,
the limit, and the flag that sets it ("... more than this server's limit of N per request (--flag).").

The body-size limit is checked (and its refusal worded) before a byte is read, by body_limit.py; the count of
inputs before any is tokenized (by each endpoint's parse, which knows the field that holds them); images before
any is fetched; tokens and the queue once the job is built, before it goes to the engine (inputs/job_limits.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from apiserver.errors import ApiError

if TYPE_CHECKING:
    from poolserve.config import Config
    from poolserve.model_card import ModelCard


def over_limit(
    subject: str, count: int | str, unit: str, limit: int, flag: str, *, param: str | None, code: str
) -> ApiError:
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


@dataclass(frozen=True, slots=True)
class TokenBudget:
    """The tokens one request may send to the model, all its inputs together (after truncation), and
    the flag that sets it. Tokenizing checks it as it goes, so a request past it is refused at the
    chunk of inputs that passes it rather than after all of them are tokenized."""

    limit: int
    flag: str = "--max-tokens-per-request"

    def check(self, tokens: int, *, so_far: bool = False) -> None:
        """`tokens` the request has (or, `so_far`, has at least: its inputs are not all counted yet)."""
        if tokens > self.limit:
            count = f"at least {tokens}" if so_far else tokens
            raise over_limit("This request", count, "tokens", self.limit, self.flag, param=None, code="too_many_tokens")


def token_budget(config: Config) -> TokenBudget:
    """--max-tokens-per-request, or the engine's whole queue (--max-queued-tokens) when that is smaller:
    a request the queue could never hold is refused by the same rule, before a token goes to the engine."""
    if config.max_queued_tokens < config.max_tokens_per_request:
        return TokenBudget(config.max_queued_tokens, "--max-queued-tokens")
    return TokenBudget(config.max_tokens_per_request)


# Values one per-token answer (/embed_all, /pooling's token_embed) may hold: tokens x hidden size. Every
# token's vector comes back, so at --max-tokens-per-request's default a 384-wide model would answer 400 MB
# of float32 (several GB of JSON); this keeps one answer near 32 MB of float32 (a few 100 MB of JSON).
MAX_TOKEN_STATE_VALUES = 8 * 1024 * 1024


def check_priority(priority: int, config: Config) -> None:
    """The operator bounds how urgent a request may be (engine_core/scheduler.py, PriorityPolicy)."""
    if priority < config.min_priority:
        raise ApiError(
            400,
            f"priority {priority} is more urgent than this server allows: the lowest accepted is "
            f"{config.min_priority} (--min-priority).",
            param="priority",
            code="priority_too_urgent",
        )


# --max-request-bytes 0 chooses by model. With images: one image inline as a base64 data URL (4/3 of
# --max-image-bytes' default 20 MiB) and the JSON around it. Text only: a request at the default token
# budget (262144 tokens) is about 1.1 MB of English, 1.6 MB as token ids, 1.6 MB of CJK text written with
# JSON's \uXXXX escapes (as Python's json.dumps writes it), so 4 MiB refuses no such request.
IMAGE_MODEL_BODY_BYTES = 32 * 1024 * 1024
TEXT_MODEL_BODY_BYTES = 4 * 1024 * 1024


def request_body_limit(config: Config, card: ModelCard) -> int:
    """--max-request-bytes, or its default for the model served: parsing and tokenizing a body costs time
    on an API server in proportion to its size (TEI's default payload limit is 2 MB)."""
    if config.max_request_bytes:
        return config.max_request_bytes
    return IMAGE_MODEL_BODY_BYTES if card.image is not None else TEXT_MODEL_BODY_BYTES


def body_bytes_in_flight_limit(config: Config, body_limit: int) -> int:
    """--max-body-bytes-in-flight, or four of the largest bodies; never below one of them, so a body up to
    the limit is let in when nothing else is held (with --max-request-bytes 0 the body limit is known
    only once the model is: config.py checks the flag against its smallest value)."""
    return max(config.max_body_bytes_in_flight or 4 * body_limit, body_limit)
