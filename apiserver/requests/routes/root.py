"""POST / (and /invocations) on an embedding model: /embed's body, as TEI routes it, or /similarity's.

TEI answers POST / of an embedding model as /embed. huggingface_hub's InferenceClient, given a bare
URL, posts both `feature_extraction` (an /embed body) and `sentence_similarity` (`inputs` an object
with `source_sentence`) there; the shape of `inputs` tells them apart, so both work.
"""

from __future__ import annotations

from typing import Literal

import msgspec

from apiserver.requests.operation import Operation, Plan, Rows
from apiserver.requests.routes import similarity
from apiserver.requests.routes.tei import parse_embed, render_embed
from apiserver.requests.schemas.common import Dimensions, Priority, TruncationDirection
from apiserver.requests.schemas.tei import EmbedRequest, SimilarityInput, SimilarityParameters, SimilarityRequest
from apiserver.requests.state import AppState

Route = Literal["embed", "similarity"]


class RootRequest(msgspec.Struct, kw_only=True):
    """/embed's fields, with `inputs` that may be /similarity's, and /similarity's `parameters`."""

    inputs: str | list[str | int | list[int]] | SimilarityInput
    normalize: bool = True
    truncate: bool | None = None
    truncation_direction: TruncationDirection = "Right"
    dimensions: Dimensions | None = None
    prompt_name: str | None = None
    parameters: SimilarityParameters | None = None
    priority: Priority = 0


def parse(request: RootRequest, state: AppState) -> Plan[Route]:
    inputs = request.inputs
    if isinstance(inputs, SimilarityInput):
        asked = SimilarityRequest(inputs=inputs, parameters=request.parameters, priority=request.priority)
        return Plan("similarity", job=similarity.parse(asked, state).job)
    embed = EmbedRequest(
        inputs=inputs, normalize=request.normalize, truncate=request.truncate,
        truncation_direction=request.truncation_direction, dimensions=request.dimensions,
        prompt_name=request.prompt_name, priority=request.priority,
    )  # fmt: skip
    return Plan("embed", job=parse_embed(embed, state).job)


def render(plan: Plan[Route], rows: Rows, state: AppState) -> bytes:
    if plan.context == "similarity":
        return similarity.render(Plan(None, job=plan.job), rows, state)
    return render_embed(Plan(None, job=plan.job), rows, state)


EMBED_OR_SIMILARITY = Operation(RootRequest, parse, render)
