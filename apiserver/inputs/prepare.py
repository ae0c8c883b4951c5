"""From a request's items to its engine job, or to what is still needed for it: remote images.

Everything synchronous (tokenizing, decoding inline images) runs on the preprocessing pool; only
http(s) fetches run on the event loop (pipeline.finish_job), where waiting on the network costs nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from apiserver.errors import bad_request
from apiserver.inputs.items import ImageSource, Item, request_items
from apiserver.inputs.job import EngineJob, Pixels, build_job, images_not_taken
from apiserver.inputs.text import resolve_token_limit
from apiserver.schemas.common import ItemsRequest
from apiserver.state import AppState
from apiserver.validation import check_dimensions, check_model, require_task

JobBuilder = Callable[[Callable[[ImageSource], Pixels]], EngineJob]


@dataclass(slots=True)
class PreparedJob:
    """A job, or what is still needed to build it: the remote images and the builder."""

    job: EngineJob | None
    remote: list[ImageSource]
    build: JobBuilder


def prepare_job(state: AppState, items: list[Item], build: JobBuilder) -> PreparedJob:
    """Build the job now unless it needs images from the network. Runs on the preprocessing pool."""
    check_images(items, state)
    remote = [item for item in items if isinstance(item, ImageSource) and state.images.is_remote(item.source)]
    if remote:
        return PreparedJob(job=None, remote=remote, build=build)
    return PreparedJob(job=build(state.images.load), remote=[], build=build)


def check_images(items: list[Item], state: AppState) -> None:
    """Whether the model takes images, and --max-images-per-request: both before any image is fetched or decoded."""
    sources = [item for item in items if isinstance(item, ImageSource)]
    if sources and state.card.image is None:
        # Refused before fetching: a text model's server would otherwise download URLs for nothing.
        raise images_not_taken(sources[0])
    count, limit = len(sources), state.config.max_images_per_request
    if count > limit:
        raise bad_request(
            f"This request has {count} images, more than this server's limit of {limit} per request "
            "(--max-images-per-request).",
            param="input",
            code="too_many_images",
        )


def prepare_items_request(
    state: AppState, request: ItemsRequest, *, task: str, endpoint: str, activation: bool = True
) -> PreparedJob:
    """Validate a request that carries `input` or `messages` and prepare its job."""
    check_model(request.model, state.model_names)
    require_task(state.card, task, endpoint)
    dimensions = check_dimensions(request.dimensions, state.card)
    items = request_items(request.input, request.messages, state.config.max_inputs_per_request)
    limit = resolve_token_limit(request.truncate_prompt_tokens, state.card)
    normalize = -1 if request.normalize is None else int(request.normalize)

    def build(load_image: Callable[[ImageSource], Pixels]) -> EngineJob:
        job = build_job(items, state.card, state.tokenizer, limit=limit, load_image=load_image)
        job.dimensions, job.normalize, job.activation = dimensions, normalize, activation
        return job

    return prepare_job(state, items, build)
