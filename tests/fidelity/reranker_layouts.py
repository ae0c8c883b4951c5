"""LLM rerankers in their real layouts: tiny random Qwen3 language models with a byte-level BPE tokenizer (Qwen's
kind: no special tokens added, ChatML control tokens), saved as sentence-transformers 6 saves a CrossEncoder over
a causal model (Transformer + LogitScore + chat_template.jinja), as it saves a sequence-classification
conversion, and as Qwen3-Reranker ships (a bare *ForCausalLM folder, served with --score-tokens and
--score-template). Each is held to its reference: `CrossEncoder.predict`, or the Qwen3-Reranker card's code.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import torch

from bench.harness.llm_reranker import (
    QWEN3_DEFAULT_INSTRUCTION,
    QWEN3_PREFIX,
    QWEN3_SUFFIX,
    QWEN3_TEMPLATE,
    TEMPLATE_FILE,
    bpe_tokenizer,
    qwen3_config,
)


def build_logit_score(folder: Path, false_token: str | None = "no", true_token: str = "yes") -> None:
    """sentence-transformers 6's LLM reranker: a CrossEncoder over a causal model, its pairs rendered by the chat
    template, scored logit(yes) - logit(no) at the last token (or one token's logit: bge-reranker-v2-gemma's)."""
    from sentence_transformers import CrossEncoder
    from sentence_transformers.base.modules import Transformer
    from sentence_transformers.cross_encoder.modules import LogitScore
    from transformers import Qwen3ForCausalLM

    base = folder.parent / f"{folder.name}-base"
    tokenizer = bpe_tokenizer(base)
    tokenizer.chat_template = QWEN3_TEMPLATE
    tokenizer.save_pretrained(base)
    torch.manual_seed(21)
    Qwen3ForCausalLM(qwen3_config(tokenizer)).eval().save_pretrained(base)
    vocab = tokenizer.get_vocab()
    score = LogitScore(vocab[true_token], None if false_token is None else vocab[false_token])
    transformer = Transformer(str(base), transformer_task="text-generation")
    CrossEncoder(modules=[transformer, score], device="cpu").save(str(folder))


def build_one_token_logit_score(folder: Path) -> None:
    build_logit_score(folder, false_token=None, true_token="Yes")


def build_sequence_classification_template(folder: Path) -> None:
    """A sequence-classification conversion of an LLM reranker (Qwen3-Reranker-seq-cls's shape): one label whose
    logit is the score, its pairs rendered by the chat template, as sentence-transformers 6 saves it."""
    from sentence_transformers import CrossEncoder
    from transformers import Qwen3ForSequenceClassification

    base = folder.parent / f"{folder.name}-base"
    tokenizer = bpe_tokenizer(base)
    tokenizer.chat_template = QWEN3_TEMPLATE
    tokenizer.save_pretrained(base)
    torch.manual_seed(22)
    Qwen3ForSequenceClassification(qwen3_config(tokenizer, num_labels=1)).eval().save_pretrained(base)
    CrossEncoder(str(base), device="cpu").save(str(folder))


def build_qwen3_reranker_card(folder: Path) -> None:
    """Qwen3-Reranker as its authors ship it: a bare Qwen3ForCausalLM and its tokenizer (whose chat template is
    the chat model's), served with --score-tokens yes no and --score-template (written beside it here)."""
    from transformers import Qwen3ForCausalLM

    tokenizer = bpe_tokenizer(folder)
    torch.manual_seed(23)
    Qwen3ForCausalLM(qwen3_config(tokenizer)).eval().save_pretrained(folder)
    (folder.parent / f"{folder.name}-{TEMPLATE_FILE}").write_text(QWEN3_TEMPLATE, encoding="utf-8")


def qwen3_card_flags(folder: Path) -> dict[str, Any]:
    return {"score_tokens": ["yes", "no"], "score_template": str(folder.parent / f"{folder.name}-{TEMPLATE_FILE}")}


def qwen3_card_scores(
    folder: Path, pairs: list[tuple[str, str]], instruction: str | None = None, max_length: int = 8192
) -> list[float]:
    """The Qwen3-Reranker model card's code, as published (its max_length the model's when given)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder, padding_side="left")
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    token_false_id = tokenizer.convert_tokens_to_ids("no")
    token_true_id = tokenizer.convert_tokens_to_ids("yes")
    prefix_tokens = tokenizer.encode(QWEN3_PREFIX, add_special_tokens=False)
    suffix_tokens = tokenizer.encode(QWEN3_SUFFIX, add_special_tokens=False)

    def format_instruction(instruction: str | None, query: str, doc: str) -> str:
        if instruction is None:
            instruction = QWEN3_DEFAULT_INSTRUCTION
        return f"<Instruct>: {instruction}\n<Query>: {query}\n<Document>: {doc}"

    texts = [format_instruction(instruction, query, doc) for query, doc in pairs]
    inputs = tokenizer(
        texts, padding=False, truncation="longest_first", return_attention_mask=False,
        max_length=max_length - len(prefix_tokens) - len(suffix_tokens),
    )  # fmt: skip
    for i, ele in enumerate(inputs["input_ids"]):
        inputs["input_ids"][i] = prefix_tokens + ele + suffix_tokens
    with warnings.catch_warnings():  # the card's pad() names a max_length that padding=True ignores, and says so
        warnings.filterwarnings("ignore", "`max_length` is ignored", UserWarning)
        batch = tokenizer.pad(inputs, padding=True, return_tensors="pt", max_length=max_length)
    with torch.no_grad():
        batch_scores = model(**batch).logits[:, -1, :]
        true_vector = batch_scores[:, token_true_id]
        false_vector = batch_scores[:, token_false_id]
        stacked = torch.nn.functional.log_softmax(torch.stack([false_vector, true_vector], dim=1), dim=1)
        return stacked[:, 1].exp().tolist()  # type: ignore[no-any-return]
