"""Query/document pairs read as an LLM reranker's own package reads them (--score-format): each part of the prompt
tokenized alone and cut by the package's rules before the token ids are joined, which no rendered template can say.

mxbai-rerank-v2 (the mxbai-rerank package's MxbaiRerankV2.prepare_inputs): prefix + query ("query: {q}", after
"instruction: {i}\\n" when given) cut to max_length * 3 // 4 + sep + document ("document: {d}") cut to what is left of
max_length + sep + task prompt + suffix. bge-reranker-v2-gemma (FlagEmbedding's FlagLLMReranker.compute_score): BOS
+ "A: {q}" cut to max_length * 3 // 4, then sep + "B: {p}" cut to max_length and the pair to max_length + sep +
prompt, then sep + prompt.

Each package cuts to a `max_length` of its own; here it is the largest whose rows fit the limit (the request's
truncation limit, else the model's maximum): a pair is what the package computes at that max_length. Without
truncation a pair the package would cut is refused instead.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass

from apiserver.errors import bad_request
from apiserver.requests.inputs.text import CHUNK_INPUTS, Truncation
from apiserver.requests.limits import TokenBudget
from apiserver.requests.tokenizer import TextTokenizer
from poolserve.model_card import ModelCard

MXBAI = "mxbai-rerank-v2"
GEMMA = "bge-reranker-v2-gemma"

# MxbaiRerankV2's class attributes, as the package writes them.
MXBAI_SEP = "\n"
MXBAI_INSTRUCTION = "instruction: {instruction}"
MXBAI_QUERY = "query: {query}"
MXBAI_DOCUMENT = "document: {document}"
MXBAI_TASK = (
    "You are a search relevance expert who evaluates how well documents match search queries. For each "
    "query-document pair, carefully analyze the semantic relationship between them, then provide your binary "
    "relevance judgment (0 for not relevant, 1 for relevant).\nRelevance:"
)
MXBAI_PREFIX = (
    "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n"
    "<|im_start|>user\n"
)
MXBAI_SUFFIX = "<|im_end|>\n<|im_start|>assistant\n"
# MxbaiRerankV2's default max_length (its constructor's), before its own cap to the model's positions.
MXBAI_MAX_LENGTH = 8192

# FlagLLMReranker's defaults: query and passage instructions, the separator and the task prompt.
GEMMA_QUERY = "A: "
GEMMA_PASSAGE = "B: "
GEMMA_SEP = "\n"
GEMMA_PROMPT = (
    "Given a query A and a passage B, determine whether the passage contains an answer to the query by providing a "
    "prediction of either 'Yes' or 'No'."
)


@dataclass(frozen=True, slots=True)
class Parts:
    """A format's fixed token ids: what goes before the query (`head`), between the parts (`sep`), after the
    document (`tail`)."""

    head: tuple[int, ...]
    sep: tuple[int, ...]
    tail: tuple[int, ...]


@functools.lru_cache(maxsize=4)
def parts_of(name: str, tokenizer: TextTokenizer, bos: int | None) -> Parts:
    def ids(text: str) -> tuple[int, ...]:
        return tuple(tokenizer.encode([text], add_special_tokens=False)[0])

    if name == MXBAI:
        sep = ids(MXBAI_SEP)
        return Parts(head=ids(MXBAI_PREFIX), sep=sep, tail=sep + ids(MXBAI_TASK) + ids(MXBAI_SUFFIX))
    sep = ids(GEMMA_SEP)
    return Parts(head=() if bos is None else (bos,), sep=sep, tail=sep + ids(GEMMA_PROMPT))


def bos_of(card: ModelCard, tokenizer: TextTokenizer) -> int | None:
    """The BOS id FlagEmbedding puts first: the tokenizer's, unless it has none or it is the padding token."""
    bos = tokenizer.token_id(card.template_tokens.get("bos_token", ""))
    pad = tokenizer.token_id(card.template_tokens.get("pad_token", ""))
    return None if bos is None or bos == pad else bos


def takes_instruction(card: ModelCard) -> bool:
    return card.pair_format == MXBAI


def check_format_instruction(card: ModelCard, instruction: str | None) -> None:
    if instruction is not None and not takes_instruction(card):
        raise bad_request(
            f"this model reads pairs as {card.pair_format} does, whose prompt has no place for an `instruction`.",
            param="instruction",
        )


def package_max_length(name: str, limit: int, parts: Parts) -> int:
    """The package's max_length whose rows fit `limit` tokens: MxbaiRerankV2 cuts query + sep + document to
    max_length and adds the rest (its predefined_length; it caps max_length so, at 8192 at most); FlagLLMReranker's
    pair is cut to max_length + sep + prompt and then gets sep + prompt again."""
    if name == MXBAI:
        return min(MXBAI_MAX_LENGTH, limit - len(parts.head) - len(parts.tail))
    return limit - 2 * len(parts.tail)


def query_text(name: str, query: str, instruction: str | None) -> str:
    if name == MXBAI:
        text = MXBAI_QUERY.format(query=query)
        return MXBAI_INSTRUCTION.format(instruction=instruction) + MXBAI_SEP + text if instruction else text
    return GEMMA_QUERY + query


def document_text(name: str, document: str) -> str:
    return MXBAI_DOCUMENT.format(document=document) if name == MXBAI else GEMMA_PASSAGE + document


def join_parts(name: str, query: list[int], document: list[int], max_length: int, parts: Parts) -> list[int]:
    """The row from the whole query's and document's ids, cut as the package cuts them."""
    first = list(parts.head) + query[: max_length * 3 // 4]
    if name == MXBAI:
        # prepare_for_model(query, sep + document, truncation="only_second", max_length=max_length); the query is
        # at most 3/4 of max_length, so the second part always has room. (Its document cut to the model's positions
        # less the rest is never the shorter: max_length is capped below them.)
        second = (list(parts.sep) + document)[: max_length - (len(first) - len(parts.head))]
        return first + second + list(parts.tail)
    # prepare_for_model(bos + query, sep + passage, truncation="only_second", max_length=max_length + sep + prompt),
    # transformers 4's rule (and FlagEmbedding's own for transformers 5): a second part no longer than what must go
    # is left whole.
    second = list(parts.sep) + document[:max_length]
    excess = len(first) + len(second) - (max_length + len(parts.tail))
    if 0 < excess < len(second):
        second = second[:-excess]
    return first + second + list(parts.tail)


def tokenize_format_pairs(
    pairs: list[tuple[str, str]],
    params: Sequence[str],
    truncation: Truncation,
    tokenizer: TextTokenizer,
    card: ModelCard,
    *,
    instruction: str | None = None,
    budget: TokenBudget | None = None,
) -> list[list[int]]:
    """Token ids of each pair as the package builds them. A pair the package would cut is refused unless the
    request asks for truncation; truncation from the left is refused (the package cuts from the right)."""
    check_format_instruction(card, instruction)
    if truncation.direction != "right" and truncation.limit is not None:
        raise bad_request(
            f"this model reads pairs as {card.pair_format} does, which cuts them from the right only: "
            f"`{truncation.option}` may cut from the right only.",
            param=truncation.option,
        )
    name = card.pair_format
    parts = parts_of(name, tokenizer, bos_of(card, tokenizer))
    limit = card.max_model_len if truncation.limit is None else truncation.limit
    max_length = package_max_length(name, limit, parts)
    if max_length < 4:  # the query keeps max_length * 3 // 4 tokens: at least one of each text
        raise bad_request(
            f"`{truncation.option}` must leave room for text: at least {limit - max_length + 4} for this model.",
            param=truncation.option,
        )
    rows: list[list[int]] = []
    total = 0
    for begin in range(0, len(pairs), CHUNK_INPUTS):
        chunk = range(begin, min(begin + CHUNK_INPUTS, len(pairs)))
        queries = tokenizer.encode(
            [query_text(name, pairs[i][0], instruction) for i in chunk], add_special_tokens=False
        )
        documents = tokenizer.encode([document_text(name, pairs[i][1]) for i in chunk], add_special_tokens=False)
        for i, query, document in zip(chunk, queries, documents, strict=True):
            row = join_parts(name, query, document, max_length, parts)
            whole = len(parts.head) + len(query) + len(document) + len(parts.sep) + len(parts.tail)
            if truncation.limit is None and len(row) < whole:
                raise bad_request(
                    f"`{params[i]}` has {whole} tokens as {name} reads it, more than its package keeps within the "
                    f"model's maximum of {card.max_model_len} (its query at most {max_length * 3 // 4} tokens); "
                    f"shorten it or set `{truncation.option}`.",
                    param=params[i],
                    code="context_length_exceeded",
                )
            rows.append(row)
            total += len(row)
        if budget is not None:
            budget.check(total, so_far=chunk.stop < len(pairs))
    return rows
