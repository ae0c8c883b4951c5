"""HuggingFace text-embeddings-inference's request and response bodies (its OpenAPI document's names)."""

from __future__ import annotations

from typing import Literal

import msgspec

from apiserver.requests.schemas.common import Dimensions, Priority, SparseThreshold, SparseTopK, TruncationDirection


class EmbedRequest(msgspec.Struct, kw_only=True):
    # A text, texts, or token ids (one list, or a list of lists).
    inputs: str | list[str | int | list[int]]
    normalize: bool = True
    truncate: bool | None = None
    truncation_direction: TruncationDirection = "Right"
    dimensions: Dimensions | None = None
    prompt_name: str | None = None
    priority: Priority = 0  # poolserve's, as vLLM names it


EmbedResponse = list[list[float]]


class EmbedAllRequest(msgspec.Struct, kw_only=True):
    """/embed_all and /embed_sparse: `inputs` as /embed takes them; no normalization, no dimensions."""

    inputs: str | list[str | int | list[int]]
    truncate: bool | None = None
    truncation_direction: TruncationDirection = "Right"
    prompt_name: str | None = None
    priority: Priority = 0  # poolserve's, as vLLM names it
    # poolserve's, Voyage's name: the texts are queries or documents (see /pooling).
    input_type: Literal["query", "document"] | None = None


class EmbedSparseRequest(EmbedAllRequest, kw_only=True):
    """/embed_sparse: TEI's fields, and poolserve's pruning of each vector (docs/api.md, "Sparse models")."""

    sparse_top_k: SparseTopK | None = None
    sparse_threshold: SparseThreshold | None = None


# Per input, per token: its hidden state.
EmbedAllResponse = list[list[list[float]]]


class SparseValue(msgspec.Struct):
    index: int
    value: float


EmbedSparseResponse = list[list[SparseValue]]


class SimilarityInput(msgspec.Struct, kw_only=True):
    source_sentence: str
    sentences: list[str]


class SimilarityParameters(msgspec.Struct, kw_only=True):
    truncate: bool | None = None
    truncation_direction: TruncationDirection = "Right"
    prompt_name: str | None = None


class SimilarityRequest(msgspec.Struct, kw_only=True):
    inputs: SimilarityInput
    parameters: SimilarityParameters | None = None
    priority: Priority = 0  # poolserve's, as vLLM names it


# The cosine similarity of each of `sentences` to `source_sentence`.
SimilarityResponse = list[float]
# POST / of an embedding model: /embed's vectors or /similarity's scores (msgspec allows one array type per union).
EmbedOrSimilarityResponse = list[list[float] | float]


class PredictRequest(msgspec.Struct, kw_only=True):
    """`inputs`: a text, a [text, text] pair, or a list of texts and/or pairs (TEI's rules)."""

    inputs: str | list[str | list[str]]
    raw_scores: bool = False
    truncate: bool | None = None
    truncation_direction: TruncationDirection = "Right"
    priority: Priority = 0  # poolserve's, as vLLM names it


class Prediction(msgspec.Struct, kw_only=True):
    score: float
    label: str


# One input: its predictions; several: a list of those (msgspec allows one array type per union).
PredictResponse = list[Prediction | list[Prediction]]


class EmbeddingModelType(msgspec.Struct):
    pooling: str


class ClassifierModelType(msgspec.Struct):
    id2label: dict[str, str]
    label2id: dict[str, int]


class ModelType(msgspec.Struct, omit_defaults=True):
    """Exactly one field is set, as in TEI: embedding, classifier, or reranker."""

    embedding: EmbeddingModelType | None = None
    classifier: ClassifierModelType | None = None
    reranker: ClassifierModelType | None = None


class ServedModelInfo(msgspec.Struct, kw_only=True):
    """One model of several: /info's fields that are the model's own."""

    model_id: str
    served_model_name: str
    model_dtype: str
    model_type: ModelType
    max_input_length: int
    max_batch_tokens: int
    max_batch_requests: int | None
    outputs: list[str]


class InfoResponse(msgspec.Struct, kw_only=True):
    model_id: str
    served_model_name: str
    model_sha: str | None
    model_dtype: str
    model_type: ModelType
    max_concurrent_requests: int
    max_input_length: int
    max_batch_tokens: int
    max_batch_requests: int | None
    max_client_batch_size: int
    auto_truncate: bool
    tokenization_workers: int
    version: str
    # poolserve's: every output a request may ask for, the model's own first (/v1/models' `outputs`).
    outputs: list[str] = msgspec.field(default_factory=list)
    # poolserve's, with several models only: each model's own fields (the ones above are the default model's).
    models: list[ServedModelInfo] | msgspec.UnsetType = msgspec.UNSET
