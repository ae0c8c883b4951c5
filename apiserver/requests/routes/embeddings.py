"""POST /v1/embeddings: OpenAI's embeddings API, for text and (CLIP-style models) images; Voyage's clients
post here too, and their fields map onto OpenAI's and vLLM's."""

from __future__ import annotations

import base64

import msgspec

from apiserver.errors import bad_request
from apiserver.requests.aliases import one_spelling, value_of
from apiserver.requests.inputs.prepare import plan_items_request
from apiserver.requests.operation import Operation, Plan, Rows
from apiserver.requests.prompts import role_prompt
from apiserver.requests.responses import encode_json, encode_rows
from apiserver.requests.schemas.common import Usage
from apiserver.requests.schemas.embeddings import EmbeddingData, EmbeddingRequest, EmbeddingResponse
from apiserver.requests.state import AppState
from apiserver.requests.vector_bytes import packed_bits
from poolserve.model_card import TASK_EMBED

BINARY_TYPES = ("binary", "ubinary")


def from_voyage(request: EmbeddingRequest, output_size: int) -> EmbeddingRequest:
    """The request with Voyage's fields said in OpenAI's and vLLM's terms: `output_dimension` is
    `dimensions`, `truncation: true` is `truncate_prompt_tokens: -1` (false: refuse over-long texts, as
    without it); the int8 types are refused (their meaning is Voyage's models' own). `input_type` picks the
    model's query or document prompt (parse)."""
    if request.output_dtype in ("int8", "uint8"):
        raise bad_request(
            f"`output_dtype` {request.output_dtype!r} is not supported: Voyage's scaling for it is its models' "
            f"own. Use 'float', 'binary' or 'ubinary'.",
            param="output_dtype",
        )
    if request.output_dimension is not None and request.output_dimension > output_size:
        raise bad_request(
            f"`output_dimension` is {request.output_dimension}; this model's vectors have {output_size}.",
            param="output_dimension",
        )
    dimensions = value_of(dimensions=request.dimensions, output_dimension=request.output_dimension)
    truncation = one_spelling(truncate_prompt_tokens=request.truncate_prompt_tokens, truncation=request.truncation)
    truncate: int | None = None
    if truncation is not None:
        name, value = truncation
        truncate = (-1 if value else None) if name == "truncation" else int(value)
    if request.output_dtype in BINARY_TYPES:
        if request.embed_dtype != "float32":
            raise bad_request(
                "`embed_dtype` is for float vectors; Voyage's binary `output_dtype` packs bits.", param="embed_dtype"
            )
        if (dimensions or output_size) % 8:
            raise bad_request(
                f"`output_dtype` {request.output_dtype!r} packs 8 dimensions a byte: ask for a multiple of 8 "
                f"dimensions (this model's vectors have {output_size}).",
                param="output_dtype",
            )
    return msgspec.structs.replace(request, dimensions=dimensions, truncate_prompt_tokens=truncate)


def parse(request: EmbeddingRequest, state: AppState) -> Plan[EmbeddingRequest]:
    request = from_voyage(request, state.card.output_size)
    # Voyage's `input_type` says whether the texts are queries or documents: the model's prompt for that role (and a
    # Router model's chain).
    prompt = role_prompt(state.card, request.input_type)
    return plan_items_request(
        state, request, task=TASK_EMBED, endpoint="/v1/embeddings", prompt=prompt, role=request.input_type
    )


def encode_embeddings(rows: Rows, request: EmbeddingRequest) -> list[list[float] | str]:
    if request.output_dtype not in BINARY_TYPES:
        return encode_rows(rows, request.encoding_format, request.embed_dtype, request.endianness)
    packed = packed_bits(rows, signed=request.output_dtype == "binary")
    if request.encoding_format == "base64":
        return [base64.b64encode(row.tobytes()).decode() for row in packed]
    integers: list[list[float] | str] = packed.tolist()
    return integers


def render(plan: Plan[EmbeddingRequest], rows: Rows, state: AppState) -> bytes:
    embeddings = encode_embeddings(rows, plan.context)
    tokens = plan.prompt_tokens
    return encode_json(
        EmbeddingResponse(
            data=[EmbeddingData(index=i, embedding=vector) for i, vector in enumerate(embeddings)],
            model=state.model_name,
            usage=Usage(prompt_tokens=tokens, total_tokens=tokens),
        )
    )


EMBEDDINGS = Operation(EmbeddingRequest, parse, render)
