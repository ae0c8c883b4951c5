"""Checks every endpoint makes before any work: the body decodes, the model name and the task fit."""

from __future__ import annotations

from typing import TypeVar

import msgspec

from apiserver.errors import ApiError, bad_request, from_validation_error
from poolserve.model_card import ModelCard, Task

T = TypeVar("T")


def decode_body(body: bytes, decoder: msgspec.json.Decoder[T]) -> T:
    try:
        return decoder.decode(body)
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        raise from_validation_error(exc) from None
    except UnicodeDecodeError as exc:
        # Earlier msgspec releases raise this, not a DecodeError, for a string that is not UTF-8 (0.23 raises a
        # DecodeError that says "Invalid UTF-8 encoded string").
        raise bad_request(
            f"The request body holds a string that is not valid UTF-8 ({exc.reason}).", code="invalid_json"
        ) from None
    except RecursionError:
        # msgspec skips a field it does not know by recursing into it; JSON nested past Python's recursion
        # limit there (even 1000 levels) raises this instead of a DecodeError.
        raise bad_request("The request body is nested too deeply to be a request.", code="invalid_json") from None


def check_model(requested: str | None, served: list[str]) -> None:
    if requested is not None and requested not in served:
        raise ApiError(
            404,
            f"The model {requested!r} does not exist; this server serves {', '.join(map(repr, served))}.",
            param="model",
            code="model_not_found",
        )


def require_task(card: ModelCard, task: Task, endpoint: str) -> None:
    if not card.supports(task) and card.is_late_interaction:
        raise bad_request(
            f"{endpoint} needs a model that can {task}; this model is a late-interaction (ColBERT) model, with one "
            "vector per token and no single embedding: ask /pooling (`token_embed`) or /embed_all for its token "
            "vectors, /score or /rerank for its MaxSim scores.",
            code="task_not_supported",
        )
    if not card.supports(task):
        raise bad_request(
            f"{endpoint} needs a model that can {task}; this model ({card.architecture}, a {card.kind} model) "
            f"serves: {', '.join(card.tasks)}.",
            code="task_not_supported",
        )


def check_dimensions(dimensions: int | None, card: ModelCard) -> int:
    if dimensions is not None and dimensions > card.output_size:
        raise bad_request(
            f"`dimensions` is {dimensions}; this model's vectors have {card.output_size}.", param="dimensions"
        )
    return dimensions or 0
