"""Which Sentence-Transformers prompt goes before a request's texts, as sentence-transformers chooses it.

A model's prompts come from its config_sentence_transformers.json (the engine sends them in the card,
with the default prompt resolved from the folder and --default-prompt-name/--default-prompt). The
prompt text is put before each text, as `SentenceTransformer.encode` does, so it is tokenized with the
text, counted in `usage`, and kept by truncation from the right. Token-id inputs get none: they are
what the model reads.
"""

from __future__ import annotations

from typing import Literal

from apiserver.errors import bad_request
from poolserve.model_card import ModelCard

# A text's role, in sentence-transformers' words; Voyage's `input_type` names the same two.
Role = Literal["query", "document"]
# encode_query's and encode_document's choice of prompt name, first found wins (sentence-transformers 5+).
ROLE_PROMPTS: dict[Role, tuple[str, ...]] = {"query": ("query",), "document": ("document", "passage", "corpus")}


def named_prompt(card: ModelCard, name: str | None, param: str = "prompt_name") -> str:
    """The prompt `name` asks for (TEI's `prompt_name`); the default prompt when no name is given."""
    if name is None:
        return card.default_prompt
    prompt = card.prompts.get(name)
    if prompt is None:
        known = ", ".join(repr(n) for n in sorted(card.prompts)) or "none"
        raise bad_request(f"`{param}` is {name!r}, which is not one of this model's prompts: {known}.", param=param)
    return prompt


def role_prompt(card: ModelCard, role: Role | None) -> str:
    """A query's or a document's prompt, as encode_query and encode_document pick it: the first of the
    role's prompt names the model has, else the default prompt."""
    if role is not None:
        for name in ROLE_PROMPTS[role]:
            if name in card.prompts:
                return card.prompts[name]
    return card.default_prompt


def takes_query_route(card: ModelCard, role: Role | None) -> bool:
    """Whether a text of this role runs through a Router model's query chain (a text with neither role takes the
    card's default route, as `encode` does); False for a model with one path."""
    return bool(card.default_route) and (role or card.default_route) == "query"


def adds_special_tokens(card: ModelCard, role: Role | None, asked: bool = True) -> bool:
    """Whether a text of this role is tokenized with the tokenizer's special tokens: as the request asks (vLLM's
    `add_special_tokens`), except where a Router model's query chain reads them without (an inference-free SPLADE's
    SparseStaticEmbedding)."""
    return asked and (card.query_special_tokens or not takes_query_route(card, role))


def left_out_tokens(card: ModelCard, prompt: str) -> int:
    """How many tokens at the start of a text after `prompt` the model's pooling leaves out: the prompt's length as
    sentence-transformers measures it where the model's Pooling has include_prompt false, else 0."""
    return card.prompt_lengths.get(prompt, 0) if prompt else 0
