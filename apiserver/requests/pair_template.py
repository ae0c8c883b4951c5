"""Query/document pairs rendered by a reranker's chat template, then tokenized, as sentence-transformers 6 does it.

A pair becomes the messages [{"role": "query", "content": query}, {"role": "document", "content": document}],
after {"role": "system", "content": instruction} when the request gives an instruction (sentence-transformers'
prompt). The template renders them as transformers' `apply_chat_template` does (the same sandboxed Jinja
environment and globals, the tokenizer's special tokens as variables), and the text is tokenized without
adding special tokens (the template writes its own). A pair cut to a limit keeps the template's tail: the tokens
after the document (an assistant turn the model's score is read after) are written back over the cut's end, the
tail found as sentence-transformers finds it, as the longest common token suffix of two renders whose contents
differ.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

from apiserver.errors import bad_request
from apiserver.requests.inputs.text import CHUNK_INPUTS, Truncation, check_room, too_long
from apiserver.requests.limits import TokenBudget
from apiserver.requests.tokenizer import TextTokenizer
from poolserve.model_card import ModelCard

# The contents sentence-transformers renders to find a template's tail: they tokenize differently at the end.
SUFFIX_FILLERS = ("0", "1 2 3 4")


def raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def tojson(
    x: Any, ensure_ascii: bool = False, indent: int | None = None, separators: Any = None, sort_keys: bool = False
) -> str:
    # transformers' own: Jinja's escapes HTML characters, which a chat template must not.
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def strftime_now(format: str) -> str:
    return datetime.now().strftime(format)


class TemplateNamespace(jinja2.utils.Namespace):
    """transformers' namespace: no attribute a template stores may start with an underscore."""

    def __init__(*args: Any, **kwargs: Any) -> None:
        self, rest = args[0], args[1:]
        for name in dict(*rest, **kwargs):
            TemplateNamespace.check_name(name)
        jinja2.utils.Namespace.__init__(self, *rest, **kwargs)

    def __setitem__(self, name: str, value: Any) -> None:
        TemplateNamespace.check_name(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)

    @staticmethod
    def check_name(name: object) -> None:
        if isinstance(name, str) and name.startswith("_"):
            raise jinja2.exceptions.SecurityError(f"a namespace attribute may not start with '_': {name!r}")


def compile_template(source: str) -> jinja2.Template:
    """The template in the environment transformers renders chat templates in."""
    environment = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols]
    )
    environment.filters["tojson"] = tojson
    environment.globals["raise_exception"] = raise_exception
    environment.globals["strftime_now"] = strftime_now
    environment.globals["dict"] = dict
    environment.globals["namespace"] = TemplateNamespace
    return environment.from_string(source)


@dataclass(frozen=True)
class PairTemplate:
    template: jinja2.Template
    special_tokens: tuple[tuple[str, str], ...]

    def render(self, query: str, document: str, instruction: str | None = None) -> str:
        messages = [{"role": "query", "content": query}, {"role": "document", "content": document}]
        if instruction is not None:
            messages.insert(0, {"role": "system", "content": instruction})
        return self.template.render(
            messages=messages, tools=None, documents=None, add_generation_prompt=False, **dict(self.special_tokens)
        )

    @functools.cached_property
    def takes_instruction(self) -> bool:
        """Whether an instruction changes what the model reads (a template may have no place for one)."""
        return self.render("q", "d", "poolserve probe instruction") != self.render("q", "d")


@functools.lru_cache(maxsize=4)
def pair_template_of(source: str, special_tokens: tuple[tuple[str, str], ...]) -> PairTemplate:
    return PairTemplate(compile_template(source), special_tokens)


def template_of(card: ModelCard) -> PairTemplate:
    return pair_template_of(card.pair_template, tuple(sorted(card.template_tokens.items())))


# Tails by (template, instruction): the instruction is rendered whole in both renders, so it can be in the tail.
@functools.lru_cache(maxsize=256)
def template_tail(template: PairTemplate, instruction: str | None, tokenizer: TextTokenizer) -> tuple[int, ...]:
    first, second = tokenizer.encode(
        [template.render(filler, filler, instruction) for filler in SUFFIX_FILLERS], add_special_tokens=False
    )
    return common_tail(first, second)


def common_tail(first: list[int], second: list[int]) -> tuple[int, ...]:
    """The ids two renders with different fillers end with: the template's tail."""
    count = 0
    for left, right in zip(reversed(first), reversed(second), strict=False):
        if left != right:
            break
        count += 1
    # Renders that never diverge have no content to tell the tail by.
    return tuple(first[len(first) - count :]) if 0 < count < min(len(first), len(second)) else ()


def check_instruction(card: ModelCard, instruction: str | None) -> None:
    if instruction is None:
        return
    if not card.pair_template:
        raise bad_request(
            "`instruction` is for rerankers that render their pairs through a chat template; this model reads "
            "a pair as it is.",
            param="instruction",
        )
    if not template_of(card).takes_instruction:
        raise bad_request("this model's chat template has no place for an `instruction`.", param="instruction")


def tokenize_rendered_pairs(
    pairs: list[tuple[str, str]],
    params: Sequence[str],
    truncation: Truncation,
    tokenizer: TextTokenizer,
    card: ModelCard,
    *,
    instruction: str | None = None,
    budget: TokenBudget | None = None,
) -> list[list[int]]:
    """Token ids of each pair as its template renders it. Longer than the model's maximum: refused, or, where the
    request asks for truncation, cut from the right to the limit with the template's tail written back."""
    check_instruction(card, instruction)
    check_cut_from_right(truncation, "pairs")
    template = template_of(card)
    tail = template_tail(template, instruction, tokenizer) if truncation.limit is not None else ()
    return encode_rendered(
        lambda i: template.render(*pairs[i], instruction),
        len(pairs),
        params,
        truncation,
        tail=tail,
        tokenizer=tokenizer,
        card=card,
        budget=budget,
    )


def check_cut_from_right(truncation: Truncation, what: str) -> None:
    """A template's start (its system part, the instruction) must stay: a request may cut its rendered `what` from
    the right only."""
    if truncation.direction != "right" and truncation.limit is not None:
        raise bad_request(
            f"this model's {what} are rendered by a chat template whose start must stay: `{truncation.option}` may "
            "cut from the right only.",
            param=truncation.option,
        )


def encode_rendered(
    render: Callable[[int], str],
    count: int,
    params: Sequence[str],
    truncation: Truncation,
    *,
    tail: tuple[int, ...],
    tokenizer: TextTokenizer,
    card: ModelCard,
    budget: TokenBudget | None,
) -> list[list[int]]:
    """Token ids of `count` inputs, input i rendered by `render(i)` (a template's whole text, its special tokens
    in it). Over the request's limit: cut from the right with the template's `tail` written back; over the
    model's maximum without one: refused."""
    limit = truncation.limit
    if limit is not None:
        check_room(limit, len(tail), truncation.option)
    rows: list[list[int]] = []
    total = 0
    for begin in range(0, count, CHUNK_INPUTS):
        chunk = range(begin, min(begin + CHUNK_INPUTS, count))
        for i, ids in zip(chunk, tokenizer.encode([render(i) for i in chunk], add_special_tokens=False), strict=True):
            row = ids
            if limit is not None and len(ids) > limit:
                row = ids[:limit]
                if tail:
                    row[-len(tail) :] = tail
            elif len(row) > card.max_model_len:
                raise too_long(params[i], len(row), card, f"set `{truncation.option}`")
            rows.append(row)
            total += len(row)
        if budget is not None:
            budget.check(total, so_far=chunk.stop < count)
    return rows
