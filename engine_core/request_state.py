"""One request's state inside the engine, from admission to its reply: its inputs, progress and rows."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from itertools import accumulate

import msgspec
import numpy as np
import numpy.typing as npt

from engine_core.runner import SparseRow
from poolserve.model_card import SPARSE, TASK_TOKEN_EMBED, ModelCard
from poolserve.protocol import EngineRequest, ForwardPass, PoolingParams


@dataclass(eq=False, slots=True)
class PendingRequest:
    """One request from one API server, batched as a unit however many inputs it holds.

    Inputs 0 .. len(lengths)-1 are texts; the `len(pixels)` inputs after them are images.
    """

    identity: bytes
    id: int
    lengths: list[int]
    tokens: npt.NDArray[np.int32]
    token_types: npt.NDArray[np.int32] | None = None
    pixels: npt.NDArray[np.uint8] | None = None
    # How its rows are pooled and finished, as the API server asked, `normalize` resolved to the model's own choice
    # where it asked none, and `sparse` only where the model's own output is not sparse already (check_request).
    params: PoolingParams = field(default_factory=PoolingParams)
    # What one image costs in the padded-token budget (its vision tokens).
    image_cost: int = 1
    # Running when an engine died: runs in batches of its own, so a second crash names it.
    is_suspect: bool = False
    # Lower runs sooner (scheduler.py).
    priority: int = 0
    # A late-interaction model's inputs: each input's count of token vectors (LateInteraction.vector_count), which
    # `output` holds in place of one row per token.
    vector_counts: list[int] | None = None
    admitted_at: float = field(default_factory=time.monotonic)
    started_at: float | None = None
    offsets: npt.NDArray[np.int64] = field(init=False)
    # Where each input's rows start in `output` when it holds per-token rows.
    row_offsets: npt.NDArray[np.int64] = field(init=False)
    # Each text input's length as a plain int, for the scheduler's per-input loop.
    costs: list[int] = field(init=False)
    # What the request weighs in the token budget and the admission limit.
    total_cost: int = field(init=False)
    texts: int = field(init=False)
    count: int = field(init=False)
    remaining: int = field(init=False)
    is_cancelled: bool = False
    is_released: bool = False
    output: npt.NDArray[np.float32] | None = None
    sparse_rows: list[SparseRow | None] | None = None
    # The scheduler's progress: inputs below `scheduled` were placed in a window, except those in
    # `returned`: handed back when a more urgent request displaced a window before it ran, or, when
    # the cache answered some inputs, the ones it did not (core.py).
    scheduled: int = 0
    returned: list[int] = field(default_factory=list)
    is_waiting: bool = False
    # Each input's key in the engine's cache (embedding_cache.py), and how many were answered from it.
    cache_keys: list[bytes] = field(default_factory=list)
    cached: int = 0
    # A traced request's forward passes so far (EngineRequest.traced); None when it is not traced.
    passes: list[ForwardPass] | None = None

    def __post_init__(self) -> None:
        self.costs = list(self.lengths)
        self.texts = len(self.costs)
        # Summed in Python: np.cumsum costs several µs on the one-input requests that are most of them.
        self.offsets = np.fromiter(accumulate(self.costs, initial=0), dtype=np.int64, count=self.texts + 1)
        self.count = self.texts + (0 if self.pixels is None else len(self.pixels))
        self.remaining = self.count
        self.row_offsets = self.offsets
        if self.vector_counts is not None:
            self.row_offsets = np.zeros(len(self.lengths) + 1, dtype=np.int64)
            np.cumsum(self.vector_counts, out=self.row_offsets[1:])
            # An expanded query runs at its expanded width.
            queries = self.params.queries
            self.costs[:queries] = map(max, self.costs[:queries], self.vector_counts[:queries])
        if self.params.sparse:
            self.sparse_rows = [None] * self.count
        self.total_cost = sum(self.costs) + (self.count - self.texts) * self.image_cost

    @property
    def key(self) -> tuple[bytes, int]:
        return (self.identity, self.id)

    @property
    def has_unscheduled(self) -> bool:
        return bool(self.returned) or self.scheduled < self.count

    def take_next(self) -> int:
        """The next input to place in a window: one handed back first, then in order."""
        if self.returned:
            return self.returned.pop()
        self.scheduled += 1
        return self.scheduled - 1

    def is_image(self, index: int) -> bool:
        return index >= self.texts

    def cost(self, index: int) -> int:
        return self.image_cost if index >= self.texts else self.costs[index]

    def input_ids(self, index: int) -> npt.NDArray[np.int32]:
        if self.texts == 1:  # most requests: the wire's layout check made its ids the whole array
            return self.tokens
        return self.tokens[self.offsets[index] : self.offsets[index + 1]]

    def input_token_types(self, index: int) -> npt.NDArray[np.int32]:
        """Token type ids of a text input; all zeros (the first segment) when none were sent."""
        if self.token_types is None:
            return np.zeros(self.lengths[index], dtype=np.int32)
        return self.token_types[self.offsets[index] : self.offsets[index + 1]]

    def image(self, index: int) -> npt.NDArray[np.uint8]:
        assert self.pixels is not None
        image: npt.NDArray[np.uint8] = self.pixels[index - self.texts]
        return image

    def start(self, now: float) -> bool:
        """Mark the request running from `now`, when its first input enters a forward pass; True that first time."""
        if self.started_at is not None:
            return False
        self.started_at = now
        return True

    def add_row(self, index: int, row: npt.NDArray[np.float32] | SparseRow) -> bool:
        """Keep input `index`'s raw output row (per token: its rows, one per token; sparse: its entries); True when
        it was the last one missing."""
        if isinstance(row, SparseRow):
            assert self.sparse_rows is not None
            self.sparse_rows[index] = row
            self.remaining -= 1
            return self.remaining == 0
        per_token = self.params.per_token
        if self.count == 1 and not per_token and row.dtype == np.float32 and row.flags.c_contiguous:
            # Its one row, kept as the view of the pass's output it is rather than copied into a row of its own:
            # a pass's output is made for it and never written again.
            self.output = row[None]
            self.remaining = 0
            return True
        if self.output is None:
            height = int(self.row_offsets[-1]) if per_token else self.count
            self.output = np.empty((height, row.shape[-1]), dtype=np.float32)
        if per_token:
            self.output[self.row_offsets[index] : self.row_offsets[index + 1]] = row
        else:
            self.output[index] = row
        self.remaining -= 1
        return self.remaining == 0


# Up to this many values, the smallest and largest are found on a Python list: a numpy reduction's set-up (~2 µs)
# costs more than the whole of a short request's ids.
SHORT_ARRAY = 128


def value_range(values: npt.NDArray[np.integer]) -> tuple[int, int]:
    """The smallest and largest of `values`, (0, 0) when there are none."""
    if not values.size:
        return 0, 0
    if values.size <= SHORT_ARRAY:
        listed = values.tolist()
        return min(listed), max(listed)
    return int(values.min()), int(values.max())


class InvalidRequest(ValueError):
    """A well-formed request with values the model cannot take; it is refused, never run."""


def check_request(identity: bytes, request: EngineRequest, card: ModelCard) -> PendingRequest:
    """Check a request's values against the model's limits (the API servers check first, this is the backstop), and
    make it the engine's own state: its arrays are the received frames' views, its params resolved."""
    lengths, tokens, token_types, pixels, params = (
        request.lengths, request.tokens, request.token_types, request.pixels, request.params
    )  # fmt: skip
    if lengths and max(lengths) > card.max_model_len:
        raise InvalidRequest(f"input lengths must be within 1..{card.max_model_len}")
    lowest, highest = value_range(tokens)
    if tokens.size and (lowest < 0 or highest >= card.vocab_size):
        raise InvalidRequest(f"token ids must be within 0..{card.vocab_size - 1}")
    if token_types is not None:
        if not card.uses_token_types:
            raise InvalidRequest("this model takes no token types")
        # An id past the model's type embeddings would fail the whole batch it lands in (and on CUDA, the device).
        lowest, highest = value_range(token_types)
        if token_types.size and (lowest < 0 or highest >= card.type_vocab_size):
            raise InvalidRequest(f"token type ids must be within 0..{card.type_vocab_size - 1}")
    if pixels is not None:
        if card.image is None:
            raise InvalidRequest("this model takes no images")
        height, width = card.image.output_size
        if pixels.shape[1:3] != (height, width):
            raise InvalidRequest(f"images must be {height}x{width} pixels")
    per_token = params.per_token
    if per_token and (not card.supports(TASK_TOKEN_EMBED) or pixels is not None):
        raise InvalidRequest("per-token output needs texts and a model that gives token states")
    if params.sparse and not card.has_sparse_output:
        raise InvalidRequest("this model has no sparse output")
    # A SPLADE model's own output is sparse: the flag asks nothing more of it.
    sparse = params.sparse and card.kind != SPARSE
    if sparse and (per_token or pixels is not None):
        raise InvalidRequest("a sparse output is one row per text")
    if params.dimensions and (card.kind == SPARSE or sparse):
        raise InvalidRequest("a sparse model's rows have no leading dimensions to keep")
    if not 0 <= params.dimensions <= card.output_size:
        raise InvalidRequest(f"dimensions must be within 0..{card.output_size}")
    late = card.late_interaction
    vector_counts = None
    if card.is_late_interaction and not per_token:
        raise InvalidRequest("a late-interaction model answers token vectors only (per_token)")
    if late is not None and per_token:
        ends = accumulate(lengths)
        vector_counts = [
            late.vector_count(tokens[end - length : end], i < params.queries)
            for i, (end, length) in enumerate(zip(ends, lengths, strict=True))
        ]
    elif params.queries and not card.default_route:
        raise InvalidRequest("queries are for late-interaction and Router models")
    if params.pool_from and not card.prompt_lengths:
        raise InvalidRequest("this model's pooling leaves no prompt out: pool_from is for one whose does")
    # A sparse output is as its model gives it unless the request asks (bge-m3's dense vector is normalized, its
    # lexical weights are not).
    # Resolved in a copy: the request is the sender's (an in-process caller's too).
    if params.normalize is None or params.sparse != sparse:
        normalize = (False if sparse else card.normalize) if params.normalize is None else params.normalize
        params = msgspec.structs.replace(params, normalize=normalize, sparse=sparse)
    return PendingRequest(
        identity=identity,
        id=request.id,
        lengths=lengths,
        tokens=tokens,
        token_types=token_types,
        pixels=pixels,
        params=params,
        image_cost=max(card.image_tokens, 1),
        is_suspect=request.is_suspect,
        priority=request.priority,
        vector_counts=vector_counts,
        passes=[] if request.traced else None,
    )
