"""The model card: what an API server needs to know of the model (its kind, tasks, lengths, tokenizer, pooling,
image processing, prompts), told by the engine in its handshake, and the closed vocabularies it is written in.
Torch-free; it travels inside the wire's `Ready` message (poolserve/protocol.py)."""

from __future__ import annotations

from typing import Final, Literal

import msgspec
import numpy as np
import numpy.typing as npt

# Closed vocabularies; msgspec refuses any other value on decode.

# Model kinds, and what each kind's output row is.
ModelKind = Literal["embedding", "classifier", "clip", "sparse"]
EMBEDDING: Final = "embedding"  # AutoModel + pooling: one vector per input
CLASSIFIER: Final = "classifier"  # AutoModelForSequenceClassification: one logit per label (cross-encoders: 1 label)
CLIP: Final = "clip"  # text and image towers projected into one space
SPARSE: Final = "sparse"  # a masked LM's logits pooled by SPLADE: one vocabulary-wide, mostly-zero vector per input

# Tasks a model card may list; each endpoint needs one of them.
Task = Literal["embed", "classify", "score", "pool", "tokenize", "token_embed", "embed_sparse"]
TASK_EMBED: Final = "embed"
TASK_CLASSIFY: Final = "classify"
TASK_SCORE: Final = "score"
TASK_POOL: Final = "pool"
TASK_TOKENIZE: Final = "tokenize"
TASK_TOKEN_EMBED: Final = "token_embed"  # every token's hidden state, unpooled (TEI's /embed_all)
TASK_EMBED_SPARSE: Final = "embed_sparse"  # one sparse vector per input (TEI's /embed_sparse)

# How token states become one vector: a pooling mode, CLIP's projection, or none (a classifier's head).
# How the card's `pooling` reads: sentence-transformers' pooling modes joined by "+" ("mean", "cls", "lasttoken",
# "max", "mean_sqrt_len_tokens", "weightedmean", "cls+mean", ...), "projection" (CLIP), "splade" (a sparse model's
# SpladePooling, TEI's name) or "none" (a classifier).
# Similarity of two embeddings, as sentence-transformers' `similarity_fn_name` names them.
Similarity = Literal["cosine", "dot", "euclidean", "manhattan"]
# What a classifier's logits go through when a request asks for scores.
Activation = Literal["sigmoid", "softmax", "none"]

# What an input longer than the model's maximum gets: --long-input, a request's `long_input` (docs/api.md, "Long
# inputs"; the API servers cut and combine the windows, the engine sees inputs that fit).
LongInput = Literal["refuse", "truncate", "chunk"]


class ImageProcessing(msgspec.Struct, kw_only=True, frozen=True):
    """How an image becomes model input, from the model's preprocessor_config.json.

    API servers do the part that shrinks the data (decode, convert to RGB, resize, center crop)
    and send uint8 height x width x 3 pixels; the engine rescales and normalizes them into float
    channels-first tensors. Every image of a model ends at the same size, so images batch.
    """

    do_convert_rgb: bool = True
    do_resize: bool = True
    # Resize so the shorter side is `resize_shortest_edge` (aspect ratio kept), or, when that is
    # 0, to exactly `resize_height` x `resize_width`.
    resize_shortest_edge: int = 0
    resize_height: int = 0
    resize_width: int = 0
    resample: int = 3  # a PIL.Image.Resampling value; 3 is BICUBIC
    do_center_crop: bool = True
    crop_height: int = 0
    crop_width: int = 0
    do_rescale: bool = True
    rescale_factor: float = 1 / 255
    do_normalize: bool = True
    image_mean: list[float] = msgspec.field(default_factory=lambda: [0.0, 0.0, 0.0])
    image_std: list[float] = msgspec.field(default_factory=lambda: [1.0, 1.0, 1.0])

    @property
    def output_size(self) -> tuple[int, int]:
        """(height, width) of the pixels an API server sends."""
        if self.do_center_crop:
            return (self.crop_height, self.crop_width)
        return (self.resize_height, self.resize_width)


# How a late-interaction model scores a query against a document (sentence-transformers' names).
LateSimilarity = Literal["maxsim", "meanmaxsim"]

# What one input gives (/v1/models' `output`): an embedding, a sparse vector's non-zero entries, token vectors, or a
# classifier's scores. A model has its own output (its kind's), and some have others a request may ask for instead
# (`ModelCard.extra_outputs`: bge-m3's lexical weights and ColBERT vectors beside its dense embedding).
Output = Literal["vector", "sparse", "multi_vector", "scores"]
OUTPUT_VECTOR: Final = "vector"
OUTPUT_SPARSE: Final = "sparse"
OUTPUT_MULTI_VECTOR: Final = "multi_vector"
OUTPUT_SCORES: Final = "scores"


class LateInteraction(msgspec.Struct, kw_only=True, frozen=True):
    """A late-interaction (ColBERT) model: one projected vector per scored token, queries and documents
    treated apart, as sentence-transformers' MultiVectorEncoder treats them.

    A query's text is cut at `query_length` tokens (0: the model's maximum) and then, with `expansion`,
    padded up to `expansion` tokens with `expansion_token_id` (ColBERT's query expansion): every position
    of a query is scored, and the model attends to the added ones only with `attend_expansion`. A
    document's text is cut at `document_length`; its tokens in `skiplist_ids` (punctuation, usually)
    are left out of its vectors. A text with neither role is a document cut at the model's maximum. With
    `drops_first` the first token (bge-m3's CLS) gives no vector."""

    query_length: int = 0
    document_length: int = 0
    expansion: int = 0
    attend_expansion: bool = False
    expansion_token_id: int = 0
    skiplist_ids: list[int] = msgspec.field(default_factory=list)
    similarity: LateSimilarity = "maxsim"
    drops_first: bool = False

    def vector_count(self, ids: npt.NDArray[np.integer], is_query: bool) -> int:
        """How many token vectors a text of these ids has: the one rule both ends cut a frame by."""
        if self.drops_first:
            ids = ids[1:]
        if is_query:
            return max(len(ids), self.expansion)
        if not self.skiplist_ids:
            return len(ids)
        return len(ids) - int(np.isin(ids, self.skiplist_ids).sum())


class TextTemplate(msgspec.Struct, kw_only=True, frozen=True):
    """A chat template through which each text is rendered before it is tokenized (without special tokens: the
    template writes its own), as sentence-transformers 6 renders a SentenceTransformer's texts when its tokenizer has
    one: the text as a user message, after a system message holding the prompt, if any."""

    source: str
    # sentence-transformers' "structured" message format: a message's content is [{"type": "text", "text": ...}]
    # rather than the text itself ("flat").
    structured: bool = False
    # The template reads a `task` variable, which sentence-transformers sets to "query" or "document" for a text
    # of that role (encode_query, encode_document).
    takes_task: bool = False


class ModelCard(msgspec.Struct, kw_only=True, frozen=True):
    """What an API server needs to know of the model, told by the engine in its handshake."""

    path: str
    architecture: str
    kind: ModelKind
    tasks: list[Task]
    max_model_len: int
    # Length of each output row: the embedding size, the number of labels of a classifier, or a sparse
    # model's vocabulary.
    output_size: int
    vocab_size: int
    pooling: str
    normalize: bool
    pad_token_id: int
    # The model's fast tokenizer as transformers builds it (padding and truncation off), so an API
    # server tokenizes exactly as transformers would without importing it.
    tokenizer_json: str
    device: str
    dtype: str
    # Classifiers: label names in output order, and the activation their config calls for.
    labels: list[str] = msgspec.field(default_factory=list)
    activation: Activation = "none"
    # Whether the model takes token type ids (BERT-style pairs).
    uses_token_types: bool = False
    # Image models: how to preprocess, and what one image costs in the token budget.
    image: ImageProcessing | None = None
    image_tokens: int = 0
    # The engine's batch limits, as resolved for this device.
    max_batch_tokens: int = 0
    max_batch_size: int = 0
    # How many token type ids the model has embeddings for (2 for BERT), so that the engine can refuse others.
    type_vocab_size: int = 0
    # Sentence-Transformers prompts by name, and the text put before every text that names none ("": none).
    prompts: dict[str, str] = msgspec.field(default_factory=dict)
    default_prompt: str = ""
    # How /score, /rerank and /similarity compare two embeddings (the folder's similarity_fn_name).
    similarity: Similarity = "cosine"
    # A reranker whose pairs are rendered by a Jinja chat template (LLM rerankers and their sequence-classification
    # conversions; apiserver/requests/pair_template.py): the template, and the special tokens it may name (transformers'
    # special_tokens_map). "": pairs are tokenized as a pair, as BERT-style cross-encoders read them.
    pair_template: str = ""
    template_tokens: dict[str, str] = msgspec.field(default_factory=dict)
    # Sparse models: the most non-zero values a row keeps (the folder's max_active_dims; 0: all of them).
    max_active_dims: int = 0
    # A late-interaction model's query and document treatment; None for a model with one vector per input.
    late_interaction: LateInteraction | None = None
    # An LLM reranker whose pairs are read as its own package reads them (--score-format;
    # apiserver/requests/pair_formats.py): "mxbai-rerank-v2" or "bge-reranker-v2-gemma"; "": by pair_template, or as a
    # pair.
    pair_format: str = ""
    # Outputs a request may ask for instead of the model's own (`Output`): bge-m3's "sparse" lexical weights
    # (PoolingParams.sparse) and "multi_vector" ColBERT vectors (PoolingParams.per_token, cut as `late_interaction`
    # says) beside its dense embedding.
    extra_outputs: list[Output] = msgspec.field(default_factory=list)
    # A model whose Pooling leaves its prompt out (sentence-transformers' `include_prompt: false`): each prompt text's
    # length in tokens as sentence-transformers measures it (the prompt tokenized alone, less a trailing special
    # token), the tokens pooling skips at the start of a text after that prompt. Empty for every other model.
    prompt_lengths: dict[str, int] = msgspec.field(default_factory=dict)
    # A Router model (sentence-transformers' Router: queries and documents take separate module chains in the
    # engine): the chain, "query" or "document", a text with neither role takes. "" for a model with one path.
    default_route: str = ""
    # Whether a Router model's query chain reads texts with the tokenizer's special tokens added (false: inference-free
    # SPLADE's SparseStaticEmbedding tokenizes queries without them).
    query_special_tokens: bool = True
    # An embedder whose texts are rendered by a chat template first (a folder without Sentence-Transformers files
    # whose tokenizer has one; apiserver/requests/text_template.py), its special tokens in `template_tokens`. None:
    # texts are tokenized as they come.
    text_template: TextTemplate | None = None

    def supports(self, task: Task) -> bool:
        return task in self.tasks

    @property
    def output(self) -> Output:
        """The model's own output: what an input gives when a request asks for no other."""
        if self.is_late_interaction:
            return OUTPUT_MULTI_VECTOR
        if self.kind == SPARSE:
            return OUTPUT_SPARSE
        return OUTPUT_SCORES if self.kind == CLASSIFIER else OUTPUT_VECTOR

    @property
    def outputs(self) -> list[Output]:
        """Every output a request may ask for, the model's own first."""
        return [self.output, *self.extra_outputs]

    @property
    def is_late_interaction(self) -> bool:
        """Whether the model's own output is token vectors (a ColBERT model), not one of its extra outputs."""
        return self.late_interaction is not None and OUTPUT_MULTI_VECTOR not in self.extra_outputs

    @property
    def has_sparse_output(self) -> bool:
        """Whether a request may ask for sparse vectors: a SPLADE model's own output, or bge-m3's lexical weights."""
        return self.kind == SPARSE or OUTPUT_SPARSE in self.extra_outputs
