"""An engine job: the token rows, token types and images of one request, how to pool them, and the engine request
they become."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from apiserver.errors import ApiError, bad_request
from apiserver.images.sources import ImageSource, Pixels
from apiserver.requests.inputs.items import Item
from apiserver.requests.inputs.text import Truncation, check_token_rows, tokenize_texts
from apiserver.requests.inputs.windows import (
    Chunking,
    Windows,
    chunk_refusal,
    chunk_texts,
    chunk_token_rows,
    flatten,
    refuse_chunking,
)
from apiserver.requests.limits import TokenBudget
from apiserver.requests.prompts import Role, adds_special_tokens, left_out_tokens, takes_query_route
from apiserver.requests.text_template import tokenize_rendered_texts
from apiserver.requests.tokenizer import Direction, TextTokenizer
from poolserve.model_card import ModelCard
from poolserve.protocol import EngineRequest, PoolingParams


@dataclass(slots=True)
class EngineJob:
    """What a request asks of the engine, as parsing builds it: token rows and images, with `params` (the options the
    engine reads: poolserve/protocol.py), and what the API server keeps to read the answer by."""

    rows: list[list[int]]
    type_rows: list[list[int]] | None = None
    images: list[Pixels] = field(default_factory=list)
    params: PoolingParams = field(default_factory=PoolingParams)
    # Output row of each request input, when texts and images were interleaved (the engine
    # answers texts first, then images).
    order: list[int] | None = None
    # A late-interaction model's count of token vectors for each input (apiserver/requests/late_interaction.py), by
    # which the engine's rows are cut.
    vector_counts: list[int] | None = None
    # Long inputs cut into windows (apiserver/requests/inputs/windows.py): the engine's rows of each input, combined
    # into one when its answer comes. None: one row per input.
    windows: Windows | None = None

    @property
    def prompt_tokens(self) -> int:
        """The tokens the model reads: an expanded query's expansion tokens too."""
        tokens = sum(len(row) for row in self.rows)
        if self.vector_counts is not None:
            tokens += sum(max(0, self.vector_counts[i] - len(self.rows[i])) for i in range(self.params.queries))
        return tokens

    def to_wire(self, *, priority: int = 0, traced: bool = False) -> EngineRequest:
        """The request the engine client sends, built once: the rows and images as arrays, with the job's params;
        `priority`: lower runs sooner; `traced`: the engine reports the forward passes it ran the job in."""
        return EngineRequest.from_rows(
            self.rows, self.type_rows, self.images, params=self.params, priority=priority, traced=traced
        )

    def token_outputs(self, rows: npt.NDArray[np.float32]) -> list[npt.NDArray[np.float32]]:
        """A per-token job's rows (one per token of every input, or per token vector of a late-interaction
        model's) cut into one tokens x dim array per input."""
        counts = self.vector_counts if self.vector_counts is not None else [len(row) for row in self.rows]
        cuts = np.cumsum(counts)[:-1]
        return np.split(rows, cuts)


def images_not_taken(source: ImageSource) -> ApiError:
    return bad_request(f"This model takes no images, but `{source.param}` is one.", param=source.param)


def check_prompt_survives(limit: int | None, direction: Direction, option: str) -> None:
    """A prompt goes before the text, so truncation from the left would cut it first; tokenizing the two apart
    would give other tokens at their seam than sentence-transformers does, so such a request is refused."""
    if limit is not None and direction == "left":
        raise bad_request(
            f"`{option}` from the left would cut this model's prompt off before the text: truncate from the "
            "right, or send token ids.",
            param=option,
        )


def pooling_starts(
    rows: Sequence[Sequence[int]], params: Sequence[str], left_out: int, option: str, *, add_special_tokens: bool = True
) -> list[int] | None:
    """Where pooling starts in each row of texts after a prompt whose first `left_out` tokens the model's pooling
    leaves out (apiserver/requests/prompts.py); None when it leaves none out. sentence-transformers counts them with the
    special tokens the tokenizer adds, and cuts only the text after them: a row without those tokens, or cut to no
    more than them, has nothing it would pool."""
    if not left_out:
        return None
    if not add_special_tokens:
        raise bad_request(
            "`add_special_tokens: false` leaves out the tokens this model's pooling counts its prompt by; send it "
            "true, or send token ids.",
            param="add_special_tokens",
        )
    for row, param in zip(rows, params, strict=True):
        if len(row) <= left_out:
            raise bad_request(
                f"`{option}` leaves none of `{param}` after the prompt, whose {left_out} tokens this model's pooling "
                "leaves out; allow more tokens.",
                param=option,
            )
    return [left_out] * len(rows)


def build_job(
    items: list[Item],
    card: ModelCard,
    tokenizer: TextTokenizer,
    *,
    limit: int | None,
    load_image: Callable[[ImageSource], Pixels] | None = None,
    params: Sequence[str] | None = None,
    direction: Direction = "right",
    option: str = "truncate_prompt_tokens",
    budget: TokenBudget | None = None,
    add_special_tokens: bool = True,
    prompt: str = "",
    role: Role | None = None,
    chunking: Chunking | None = None,
    per_token: bool = False,
) -> EngineJob:
    """Tokenize the texts (each after `prompt`, apiserver/requests/prompts.py), check the token rows, decode the
    images of a request's items. `role`: whether the inputs are queries or documents, the chain they take on a
    Router model (None: its default). `chunking`: over-long inputs are cut into windows (`limit` is then None);
    `per_token`: the job answers every token's state (which windows would not give once)."""
    params = params or [f"input[{k}]" for k in range(len(items))]
    texts = [(k, item) for k, item in enumerate(items) if isinstance(item, str)]
    token_rows = [(k, item) for k, item in enumerate(items) if isinstance(item, list)]
    sources = [item for item in items if isinstance(item, ImageSource)]
    pool_from: list[int] | None = None  # token ids are what the model reads: no prompt to leave out
    add_special_tokens = adds_special_tokens(card, role, add_special_tokens)
    windows: Windows | None = None
    if token_rows:
        token_params = [params[k] for k, _ in token_rows]
        given = [row for _, row in token_rows]
        if chunking is None:
            rows = check_token_rows(given, token_params, limit, card, direction)
        else:  # checked whole (the longest's length cuts none), then cut
            check_token_rows(given, token_params, max(map(len, given)), card)
            refuse_chunking(token_params, given, card, chunking, chunk_refusal(card, "", per_token=per_token))
            rows, windows = flatten(chunk_token_rows(given, card, chunking))
    elif chunking is not None and texts and card.text_template is None:
        refusal = chunk_refusal(card, prompt, per_token=per_token)
        pieces = chunk_texts(
            [prompt + text for _, text in texts], [params[k] for k, _ in texts], tokenizer, card, chunking,
            budget=budget, add_special_tokens=add_special_tokens, refusal=refusal,
        )  # fmt: skip
        rows, windows = flatten(pieces)
    elif card.text_template is not None and texts:  # rendered by the model's chat template, prompt and all
        text_params = [params[k] for k, _ in texts]
        truncation = Truncation(limit, direction, option)
        rows = tokenize_rendered_texts(
            [text for _, text in texts], text_params, truncation, tokenizer, card, prompt=prompt, task=role,
            budget=budget,
        )  # fmt: skip
    else:
        text_params = [params[k] for k, _ in texts]
        text_list = [text for _, text in texts]
        if prompt and text_list:
            check_prompt_survives(limit, direction, option)
            text_list = [prompt + text for text in text_list]
        rows = tokenize_texts(
            text_list, text_params, limit, tokenizer, card, direction=direction, option=option, budget=budget,
            add_special_tokens=add_special_tokens,
        )  # fmt: skip
        pool_from = pooling_starts(
            rows, text_params, left_out_tokens(card, prompt), option, add_special_tokens=add_special_tokens
        )
    images: list[Pixels] = []
    if sources:
        if card.image is None or load_image is None:
            raise images_not_taken(sources[0])
        images = [load_image(source) for source in sources]
    if windows is not None and images:
        windows.counts.extend([1] * len(images))  # the engine answers texts first, then images
        windows.tokens.extend([card.image_tokens] * len(images))
    queries = len(rows) if takes_query_route(card, role) else 0
    pooling = PoolingParams(queries=queries, pool_from=pool_from or [])
    job = EngineJob(rows=rows, images=images, params=pooling, windows=windows)
    if texts and sources:
        text_rank = itertools.count()
        image_rank = itertools.count(len(texts))
        job.order = [next(text_rank) if isinstance(item, str) else next(image_rank) for item in items]
    return job
