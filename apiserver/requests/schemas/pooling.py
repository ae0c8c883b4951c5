"""POST /pooling (vLLM's shape): the model's pooled output for any model kind."""

from __future__ import annotations

from typing import Literal

import msgspec

from apiserver.requests.schemas.common import ItemsRequest, SparseThreshold, SparseTopK, Usage
from apiserver.requests.schemas.tei import SparseValue

# vLLM's pooling tasks (vllm/tasks.py), `encode`, its older name for per-token output, and poolserve's `embed_sparse`
# (a model's sparse vectors, as TEI's /embed_sparse: bge-m3's lexical weights beside its dense vector).
PoolingTask = Literal["embed", "classify", "score", "token_embed", "token_classify", "plugin", "encode", "embed_sparse"]


class PoolingRequest(ItemsRequest, kw_only=True):
    # Classifiers: apply the model's activation (sigmoid/softmax) to the logits (None: do). vLLM's
    # older name for `use_activation`.
    activation: bool | None = None
    # None: the model's own output (a vector, a classifier's scores, a sparse model's non-zero entries, or a
    # late-interaction model's token vectors); bge-m3's own is its dense vector (`token_embed`: its ColBERT vectors,
    # `embed_sparse`: its lexical weights).
    task: PoolingTask | None = None
    # A sparse model's pruning (docs/api.md, "Sparse models").
    sparse_top_k: SparseTopK | None = None
    sparse_threshold: SparseThreshold | None = None
    # Voyage's name: the texts are queries or documents (the model's prompt for that role; on a late-interaction
    # model, also its query expansion or document skiplist). None: as the model's `encode` treats a text.
    input_type: Literal["query", "document"] | None = None


class PoolingData(msgspec.Struct, kw_only=True):
    object: Literal["pooling"] = "pooling"
    index: int
    # A vector, a tokens x dim matrix (`token_embed`), base64 of either's values in `embed_dtype`, or a sparse
    # model's non-zero entries as TEI's /embed_sparse gives them ({index, value}, in index order).
    data: list[float | list[float] | SparseValue] | str


class PoolingResponse(msgspec.Struct, kw_only=True):
    id: str
    object: Literal["list"] = "list"
    created: int
    model: str
    data: list[PoolingData]
    usage: Usage
