"""An LLM reranker's pairs rendered in the API server as transformers' apply_chat_template renders them, and the
requests that such a model cannot honour refused by name before anything reaches the engine."""

from __future__ import annotations

from typing import Any

import jinja2
import pytest

from apiserver.errors import ApiError
from apiserver.requests.inputs.text import Truncation
from apiserver.requests.pair_scores import plan_scores
from apiserver.requests.pair_template import template_of, template_tail, tokenize_rendered_pairs
from apiserver.requests.tokenizer import TextTokenizer
from bench.harness.llm_reranker import QWEN3_SUFFIX, QWEN3_TEMPLATE
from poolserve.model_card import ModelCard
from tests.utils import reranker_card

# Jinja the way chat templates use it: a loop, a namespace, tojson, raise_exception, a special token variable.
BUSY_TEMPLATE = (
    "{%- set ns = namespace(system='none') -%}\n"
    "{%- for message in messages %}\n"
    "  {%- if message.role == 'system' %}{% set ns.system = message.content %}{% endif %}\n"
    "{%- endfor %}\n"
    "{{ eos_token }}[{{ ns.system | tojson }}]\n"
    "{% for message in messages if message.role != 'system' %}\n"
    "{{ message.role }}: {{ message.content | tojson }}\n"
    "{% endfor %}\n"
    "{% if messages | length > 3 %}{{ raise_exception('too many') }}{% endif %}"
    "<|im_start|>assistant\n"
)


def card_for(hf_tokenizer: Any, template: str, max_model_len: int = 64) -> ModelCard:
    return reranker_card(hf_tokenizer, max_model_len, pair_template=template)


@pytest.mark.parametrize("template", [QWEN3_TEMPLATE, BUSY_TEMPLATE], ids=["qwen3-reranker", "jinja-features"])
@pytest.mark.parametrize("instruction", [None, 'Find "quoted" <b>text</b>'])
def test_a_pair_renders_and_tokenizes_as_transformers_apply_chat_template_does(
    hf_tokenizer: Any, template: str, instruction: str | None
) -> None:
    card = card_for(hf_tokenizer, template, max_model_len=4096)
    query, document = "what's <b>here</b>?\n", "  déjà vu & 'quotes'  "
    messages = [{"role": "query", "content": query}, {"role": "document", "content": document}]
    if instruction is not None:
        messages.insert(0, {"role": "system", "content": instruction})
    expected_text = hf_tokenizer.apply_chat_template(messages, chat_template=template, tokenize=False)
    assert template_of(card).render(query, document, instruction) == expected_text
    expected_ids = hf_tokenizer.apply_chat_template(messages, chat_template=template, tokenize=True, return_dict=True)
    rows = tokenize_rendered_pairs(
        [(query, document)], ["documents[0]"], Truncation(None), TextTokenizer(card.tokenizer_json), card,
        instruction=instruction,
    )  # fmt: skip
    assert rows == [list(expected_ids["input_ids"])]


def test_a_cut_pair_keeps_the_templates_tail(hf_tokenizer: Any) -> None:
    card = card_for(hf_tokenizer, QWEN3_TEMPLATE)
    tokenizer = TextTokenizer(card.tokenizer_json)
    tail = list(template_tail(template_of(card), None, tokenizer))
    # The tail is what follows the document: the card's suffix (Jinja keeps its last newline here: it is an
    # expression), tokenized alone.
    assert tail == hf_tokenizer.encode(QWEN3_SUFFIX, add_special_tokens=False)
    [row] = tokenize_rendered_pairs([("q", "a long document " * 50)], ["d"], Truncation(40), tokenizer, card)
    whole = tokenizer.encode([template_of(card).render("q", "a long document " * 50)], add_special_tokens=False)[0]
    assert len(row) == 40 and row[-len(tail) :] == tail and row[: 40 - len(tail)] == whole[: 40 - len(tail)]


def test_what_a_templated_reranker_cannot_honour_is_refused_by_name(hf_tokenizer: Any) -> None:
    card = card_for(hf_tokenizer, QWEN3_TEMPLATE)
    tokenizer = TextTokenizer(card.tokenizer_json)
    pairs, params = [("q", "d")], ["documents[0]"]

    def refusal(**options: Any) -> ApiError:
        truncation = options.pop("truncation", Truncation(None))
        with pytest.raises(ApiError) as refused:
            plan_scores(pairs, params, card, tokenizer, truncation=truncation, **options)
        return refused.value

    assert refusal(truncation=Truncation(32, "left", "truncate")).param == "truncate"
    assert refusal(second_tokens=8).param == "max_tokens_per_doc"
    long_pairs = [("q", "word " * 200)]
    with pytest.raises(ApiError, match="more than the model's maximum of 64"):
        plan_scores(long_pairs, params, card, tokenizer, truncation=Truncation(None))
    # A template with no place for a system message takes no instruction; a model without one neither.
    fixed = QWEN3_TEMPLATE.replace("messages[0].content if messages[0].role == 'system' else ", "")
    assert fixed != QWEN3_TEMPLATE
    no_system = card_for(hf_tokenizer, fixed, max_model_len=4096)
    with pytest.raises(ApiError, match=r"no place for an `instruction`"):
        plan_scores(pairs, params, no_system, tokenizer, truncation=Truncation(None), instruction="x")
    plain = card_for(hf_tokenizer, "", max_model_len=4096)
    with pytest.raises(ApiError, match="`instruction` is for rerankers"):
        plan_scores(pairs, params, plain, tokenizer, truncation=Truncation(None), instruction="x")


def test_the_template_renders_in_a_sandbox(hf_tokenizer: Any) -> None:
    """A template is code from a folder: it runs sandboxed, as transformers runs it."""
    hostile = "{{ messages.__class__.__mro__ }}{{ (messages | first).content }}{{ (messages | last).content }}"
    card = card_for(hf_tokenizer, hostile)
    with pytest.raises(jinja2.exceptions.SecurityError):
        template_of(card).render("q", "d")
