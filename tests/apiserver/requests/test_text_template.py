"""An embedder's texts rendered in the API server by its chat template as sentence-transformers 6 renders them (as
transformers' apply_chat_template renders its messages), and cut keeping the template's tail."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from apiserver.errors import ApiError
from apiserver.requests.inputs.job import build_job
from apiserver.requests.inputs.text import Truncation
from apiserver.requests.text_template import chat_texts, text_tail, tokenize_rendered_texts
from apiserver.requests.tokenizer import TextTokenizer
from poolserve.model_card import EMBEDDING, TASK_EMBED, TextTemplate
from tests.fidelity.layouts import CHAT_TEMPLATE
from tests.utils import reranker_card

# A structured template (content as typed parts, as vision-language models' templates read it).
STRUCTURED_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message.role }}\n"
    "{% for part in message.content %}{% if part.type == 'text' %}{{ part.text }}{% endif %}{% endfor %}"
    "<|im_end|>\n{% endfor %}<|endoftext|>"
)


def embedder_card(hf_tokenizer: Any, source: str, *, structured: bool = False, max_model_len: int = 64) -> Any:
    card = reranker_card(hf_tokenizer, max_model_len, architecture="Qwen3Model")
    template = TextTemplate(source=source, structured=structured, takes_task="task" in source)
    return msgspec.structs.replace(
        card, kind=EMBEDDING, tasks=[TASK_EMBED], output_size=32, pooling="lasttoken", text_template=template
    )


@pytest.mark.parametrize(("source", "structured"), [(CHAT_TEMPLATE, False), (STRUCTURED_TEMPLATE, True)])
@pytest.mark.parametrize("prompt", ["", "Represent this sentence: "])
@pytest.mark.parametrize("task", [None, "query"])
def test_a_text_renders_as_apply_chat_template_renders_its_user_message(
    hf_tokenizer: Any, source: str, structured: bool, prompt: str, task: str | None
) -> None:
    """sentence-transformers' messages: the prompt as a system message, the text as the user's; its `task` where the
    template reads one."""
    chat = chat_texts(embedder_card(hf_tokenizer, source, structured=structured))

    def message(role: str, content: str) -> dict[str, Any]:
        return {"role": role, "content": [{"type": "text", "text": content}] if structured else content}

    messages = ([message("system", prompt)] if prompt else []) + [message("user", "déjà vu <b>")]
    extra = {"task": task} if task else {}
    expected = hf_tokenizer.apply_chat_template(messages, chat_template=source, tokenize=False, **extra)
    assert chat.render("déjà vu <b>", prompt, task) == expected


def test_a_cut_text_keeps_the_templates_tail(hf_tokenizer: Any) -> None:
    card = embedder_card(hf_tokenizer, CHAT_TEMPLATE, max_model_len=16)
    tokenizer = TextTokenizer(card.tokenizer_json)
    tail = text_tail(chat_texts(card), "", "query", tokenizer)
    assert hf_tokenizer.decode(list(tail)) == "<|im_end|>\n<|im_start|>query\n<|endoftext|>"
    long = " ".join(["servers run in racks"] * 10)
    (row,) = tokenize_rendered_texts([long], ["input[0]"], Truncation(16), tokenizer, card, task="query")
    assert len(row) == 16 and tuple(row[-len(tail) :]) == tail
    with pytest.raises(ApiError, match="more than the model's maximum of 16"):
        tokenize_rendered_texts([long], ["input[0]"], Truncation(None), tokenizer, card)
    with pytest.raises(ApiError, match="may cut from the right only"):
        tokenize_rendered_texts([long], ["input[0]"], Truncation(16, "left"), tokenizer, card)
    # An embedding job renders its texts; token ids are what the model reads.
    job = build_job(["hello"], card, tokenizer, limit=None, role="query")
    assert (
        job.rows[0]
        == hf_tokenizer.apply_chat_template(
            [{"role": "user", "content": "hello"}], chat_template=CHAT_TEMPLATE, task="query", tokenize=True
        )["input_ids"]
    )
    assert build_job([[5, 6]], card, tokenizer, limit=None).rows == [[5, 6]]
