"""Plans for requests that carry `input` or `messages` (/v1/embeddings, /pooling): their engine job, or
what is still needed for it, remote images.

Everything synchronous (tokenizing, decoding inline images) runs on the preprocessing pool; only
http(s) fetches run on the event loop (request_cycle.py), where waiting on the network costs nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from apiserver.errors import bad_request
from apiserver.images.sources import ImageSource, Pixels
from apiserver.requests.aliases import value_of
from apiserver.requests.inputs.items import Item, request_items
from apiserver.requests.inputs.job import EngineJob, build_job, images_not_taken
from apiserver.requests.inputs.text import vllm_truncation
from apiserver.requests.inputs.windows import long_input_mode
from apiserver.requests.late_interaction import token_vectors_job
from apiserver.requests.limits import check_image_count
from apiserver.requests.operation import JobBuilder, Plan
from apiserver.requests.prompts import Role
from apiserver.requests.schemas.common import ItemsRequest
from apiserver.requests.state import AppState
from apiserver.requests.validation import check_dimensions, check_model, require_task
from poolserve.model_card import CLASSIFIER, SPARSE, ModelCard, Task

I = TypeVar("I", bound=ItemsRequest)  # noqa: E741


def plan_job(state: AppState, items: list[Item], build: JobBuilder, context: I) -> Plan[I]:
    """Build the job now unless it needs images from the network. Runs on the preprocessing pool."""
    check_images(items, state)
    remote = [item for item in items if isinstance(item, ImageSource) and state.images.is_remote(item.source)]
    if remote:
        return Plan(context, remote=remote, build=build)
    return Plan(context, job=build(state.images.load))


def check_images(items: list[Item], state: AppState) -> None:
    """Whether the model takes images, and how many: both before any image is fetched or decoded."""
    sources = [item for item in items if isinstance(item, ImageSource)]
    if sources and state.card.image is None:
        # Refused before fetching: a text model's server would otherwise download URLs for nothing.
        raise images_not_taken(sources[0])
    check_image_count(len(sources), state.config.max_images_per_request)


def refuse_options_of_another_kind(
    card: ModelCard, request: ItemsRequest, activation: bool | None, *, sparse: bool = False
) -> None:
    """An embedding model's options sent to a classifier, or a classifier's to an embedding model, would
    change nothing: refused by name, as vLLM refuses a parameter its task does not take. `sparse`: the request
    asks for sparse vectors."""
    if (card.kind == SPARSE or sparse) and request.dimensions is not None:
        raise bad_request(
            "`dimensions` keeps a dense vector's leading values; the vectors asked for are sparse (vocabulary-wide).",
            param="dimensions",
        )
    if card.kind == CLASSIFIER:
        for name, value in (("normalize", request.normalize), ("dimensions", request.dimensions)):
            if value is not None:
                raise bad_request(
                    f"`{name}` is for embedding models; this model is a classifier (`use_activation` says "
                    f"whether its scores get their activation).",
                    param=name,
                )
    elif activation is not None:
        raise bad_request(
            "`activation` is for classifiers; this model embeds (`normalize` or `use_activation` says whether "
            "its vectors are normalized).",
            param="activation",
        )


def plan_items_request(
    state: AppState,
    request: I,
    *,
    task: Task,
    endpoint: str,
    activation: bool | None = None,
    per_token: bool = False,
    normalize_default: bool | None = None,
    prompt: str | None = None,
    role: Role | None = None,
    sparse: bool = False,
) -> Plan[I]:
    """Validate a request that carries `input` or `messages` and plan its job. `activation`: the request's
    `activation` field where it has one (vLLM's older name for `use_activation`); `normalize_default`: the
    normalization when the request does not say (None: the model's own); `prompt`: what goes before each
    text (None: the model's default prompt, or on a late-interaction model the prompt of `role`, whose texts
    are its queries or documents: apiserver/requests/late_interaction.py; `role` also picks a Router model's chain);
    `sparse`: the model's sparse output (bge-m3's lexical weights) instead of its own. On bge-m3 `per_token` asks for
    its ColBERT vectors."""
    check_model(request.model, state.model_names)
    require_task(state.card, task, endpoint)
    dimensions = check_dimensions(request.dimensions, state.card)
    token_vectors = state.card.is_late_interaction or (per_token and state.card.late_interaction is not None)
    if dimensions and token_vectors:
        # MultiVectorEncoder has no truncate_dim: a cut token vector would be no vector its reference gives.
        raise bad_request("`dimensions` is for single-vector models; this late-interaction model's token vectors "
                          "come whole.", param="dimensions")  # fmt: skip
    items = request_items(request.input, request.messages, state.config.max_inputs_per_request)
    truncate, chunking = long_input_mode(request.long_input, request.truncate_prompt_tokens, state.config)
    truncation = vllm_truncation(truncate, state.card, request.truncation_side)
    refuse_options_of_another_kind(state.card, request, activation, sparse=sparse)
    # vLLM's `use_activation` is an embedding model's normalization and a classifier's activation.
    normalize = value_of(normalize=request.normalize, use_activation=request.use_activation)
    activation = value_of(use_activation=request.use_activation, activation=activation)

    def build(load_image: Callable[[ImageSource], Pixels]) -> EngineJob:
        if token_vectors:
            job = token_vectors_job(
                items, state.card, state.tokenizer, role, truncation=truncation, budget=state.token_budget,
                add_special_tokens=request.add_special_tokens, prompt=prompt,
            )  # fmt: skip
            job.params.normalize = normalize
            return job
        job = build_job(
            items, state.card, state.tokenizer, limit=truncation.limit, load_image=load_image,
            direction=truncation.direction, budget=state.token_budget, add_special_tokens=request.add_special_tokens,
            prompt=state.card.default_prompt if prompt is None else prompt, role=role, chunking=chunking,
            per_token=per_token,
        )  # fmt: skip
        if per_token and job.images:
            raise bad_request(f"{endpoint} gives token states of texts; this request holds images.", param="input")
        params = job.params
        params.dimensions, params.activation, params.per_token = dimensions, activation is not False, per_token
        params.normalize = normalize_default if normalize is None else normalize
        params.sparse = sparse
        if job.windows is not None:  # the windows' vectors are averaged first, then normalized as asked
            job.windows.normalize = state.card.normalize if params.normalize is None else params.normalize
            params.normalize = False
        return job

    return plan_job(state, items, build, request)
