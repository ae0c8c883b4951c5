"""An LLM reranker's parts for the bench and the tests: a byte-level BPE tokenizer in Qwen's shape (trained here,
no hub), Qwen3-Reranker's prompt as its card writes it and as a chat template over sentence-transformers' pair
messages, and a Qwen3 config over that tokenizer."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bench.harness.corpus import make_sentences
from bench.harness.models import TINY

# Qwen3-Reranker's prompt, as its model card's code builds it.
QWEN3_PREFIX = (
    "<|im_start|>system\nJudge whether the Document meets the requirements based on the Query and the Instruct "
    'provided. Note that the answer can only be "yes" or "no".<|im_end|>\n<|im_start|>user\n'
)
QWEN3_SUFFIX = "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
QWEN3_DEFAULT_INSTRUCTION = "Given a web search query, retrieve relevant passages that answer the query"
# The same prompt as a chat template over sentence-transformers' pair messages (a system message is the
# request's instruction). Expressions, not blocks, where a newline follows: trim_blocks would eat it.
QWEN3_TEMPLATE = (
    QWEN3_PREFIX + "<Instruct>: {{ messages[0].content if messages[0].role == 'system' else '"
    + QWEN3_DEFAULT_INSTRUCTION + "' }}\n"
    "<Query>: {{ (messages | selectattr('role', 'eq', 'query') | first).content }}\n"
    "<Document>: {{ (messages | selectattr('role', 'eq', 'document') | first).content }}"
    + QWEN3_SUFFIX.replace("\n\n</think>\n\n", "\n\n</think>{{ '\\n\\n' }}")
)  # fmt: skip
TEMPLATE_FILE = "reranker_template.jinja"
MAX_POSITIONS = 256


def bpe_tokenizer(folder: Path) -> Any:
    """A byte-level BPE tokenizer trained here, in Qwen's shape: "yes", "no", "Yes", "0", "1" single tokens, ChatML
    control tokens, nothing added around a text."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=1200,
        special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    corpus = [*make_sentences(200, seed=7), QWEN3_PREFIX, QWEN3_SUFFIX, QWEN3_DEFAULT_INSTRUCTION] * 3
    tokenizer.train_from_iterator(corpus + ["yes", "no", "Yes", "No", "0", "1"] * 300, trainer)
    fast = PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
        tokenizer_object=tokenizer, eos_token="<|im_end|>", pad_token="<|endoftext|>"
    )
    fast.save_pretrained(folder)
    return fast


def qwen3_config(tokenizer: Any, **kwargs: Any) -> Any:
    """A tiny Qwen3 (TINY's sizes unless `kwargs` say otherwise) over `tokenizer`'s vocabulary."""
    from transformers import Qwen3Config

    defaults = {"max_position_embeddings": MAX_POSITIONS, "num_key_value_heads": 2, "head_dim": 8, **TINY}
    return Qwen3Config(
        vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id, tie_word_embeddings=False,
        **{**defaults, **kwargs},
    )  # fmt: skip
