"""An embedder's texts rendered by its chat template, then tokenized, as sentence-transformers 6 renders a
SentenceTransformer's texts when its tokenizer has a chat template (a folder without its files: docs/models.md).

A text becomes the message {"role": "user", "content": text} (its content [{"type": "text", "text": text}] in the
"structured" format), after {"role": "system", "content": prompt} where a prompt applies; the template renders it in
the environment transformers' `apply_chat_template` uses (apiserver/requests/pair_template.py), with `task` set to the
text's role where the template reads one, and the text is tokenized without adding special tokens (the template writes
its own). A text cut to a limit keeps the template's tail: the tokens after the text are written back over the cut's
end, the tail found as sentence-transformers finds it, the longest common token suffix of two renders whose user
contents differ.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import jinja2

from apiserver.requests.inputs.text import Truncation
from apiserver.requests.limits import TokenBudget
from apiserver.requests.pair_template import (
    SUFFIX_FILLERS,
    check_cut_from_right,
    common_tail,
    compile_template,
    encode_rendered,
)
from apiserver.requests.tokenizer import TextTokenizer
from poolserve.model_card import ModelCard, TextTemplate


@dataclass(frozen=True)
class ChatTexts:
    template: jinja2.Template
    special_tokens: tuple[tuple[str, str], ...]
    structured: bool
    takes_task: bool

    def message(self, role: str, content: str) -> dict[str, Any]:
        return {"role": role, "content": [{"type": "text", "text": content}] if self.structured else content}

    def render(self, text: str, prompt: str, task: str | None) -> str:
        messages = [self.message("system", prompt)] if prompt else []
        messages.append(self.message("user", text))
        variables = {"task": task} if self.takes_task and task is not None else {}
        return self.template.render(
            messages=messages, tools=None, documents=None, add_generation_prompt=False,
            **dict(self.special_tokens), **variables,
        )  # fmt: skip


@functools.lru_cache(maxsize=4)
def chat_texts_of(spec: TextTemplate, special_tokens: tuple[tuple[str, str], ...]) -> ChatTexts:
    return ChatTexts(compile_template(spec.source), special_tokens, spec.structured, spec.takes_task)


def chat_texts(card: ModelCard) -> ChatTexts:
    assert card.text_template is not None
    return chat_texts_of(card.text_template, tuple(sorted(card.template_tokens.items())))


# Tails by (template, prompt, task): the prompt is rendered whole in both renders, so it can be in the tail.
@functools.lru_cache(maxsize=256)
def text_tail(chat: ChatTexts, prompt: str, task: str | None, tokenizer: TextTokenizer) -> tuple[int, ...]:
    first, second = tokenizer.encode(
        [chat.render(filler, prompt, task) for filler in SUFFIX_FILLERS], add_special_tokens=False
    )
    return common_tail(first, second)


def tokenize_rendered_texts(
    texts: Sequence[str],
    params: Sequence[str],
    truncation: Truncation,
    tokenizer: TextTokenizer,
    card: ModelCard,
    *,
    prompt: str = "",
    task: str | None = None,
    budget: TokenBudget | None = None,
) -> list[list[int]]:
    """Token ids of each text as the model's chat template renders it (after `prompt`, in the role `task`). Longer
    than the model's maximum: refused, or, where the request asks for truncation, cut from the right to the limit
    with the template's tail written back."""
    check_cut_from_right(truncation, "texts")
    chat = chat_texts(card)
    tail = text_tail(chat, prompt, task, tokenizer) if truncation.limit is not None else ()
    return encode_rendered(
        lambda i: chat.render(texts[i], prompt, task),
        len(texts),
        params,
        truncation,
        tail=tail,
        tokenizer=tokenizer,
        card=card,
        budget=budget,
    )
