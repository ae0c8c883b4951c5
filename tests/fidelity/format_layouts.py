"""LLM rerankers served with --score-format, as their own packages read them: a tiny random Qwen2ForCausalLM
(mxbai-rerank-v2's architecture) and a tiny random GemmaForCausalLM (bge-reranker-v2-gemma's), bare folders with a
byte-level BPE tokenizer (Gemma's adds BOS, as Gemma's does). The references: the mxbai-rerank package itself
(MxbaiRerankV2.predict), and FlagEmbedding's FlagLLMReranker.compute_score transcribed (its install brings
datasets, pandas, pyarrow and peft, too heavy for `make test`).
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from bench.harness.llm_reranker import bpe_tokenizer
from bench.harness.models import TINY

MAX_POSITIONS = 512


def build_mxbai_rerank_v2(folder: Path) -> None:
    """mxbai-rerank-v2 as mixedbread ships it: a bare Qwen2ForCausalLM and its ChatML tokenizer."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    tokenizer = bpe_tokenizer(folder)
    config = Qwen2Config(
        vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id, tie_word_embeddings=False,
        max_position_embeddings=MAX_POSITIONS, num_key_value_heads=2, **TINY,
    )  # fmt: skip
    torch.manual_seed(31)
    Qwen2ForCausalLM(config).eval().save_pretrained(folder)


def build_bge_reranker_v2_gemma(folder: Path) -> None:
    """bge-reranker-v2-gemma as BAAI ships it: a bare GemmaForCausalLM whose tokenizer adds BOS."""
    from tokenizers import processors
    from transformers import GemmaConfig, GemmaForCausalLM, PreTrainedTokenizerFast

    base = bpe_tokenizer(folder.parent / f"{folder.name}-tokenizer")
    backend = base.backend_tokenizer
    backend.add_special_tokens(["<bos>", "<eos>", "<pad>"])
    bos = backend.token_to_id("<bos>")
    backend.post_processor = processors.TemplateProcessing(
        single="<bos> $A", pair="<bos> $A $B", special_tokens=[("<bos>", bos)]
    )
    tokenizer = PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
        tokenizer_object=backend, bos_token="<bos>", eos_token="<eos>", pad_token="<pad>"
    )
    tokenizer.save_pretrained(folder)
    assert tokenizer("x")["input_ids"][0] == bos
    config = GemmaConfig(
        vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id, bos_token_id=bos,
        eos_token_id=tokenizer.eos_token_id, max_position_embeddings=MAX_POSITIONS, num_key_value_heads=2,
        head_dim=8, **TINY,
    )  # fmt: skip
    torch.manual_seed(32)
    GemmaForCausalLM(config).eval().save_pretrained(folder)


def mxbai_flags(folder: Path) -> dict[str, Any]:
    return {"score_format": "mxbai-rerank-v2"}


def gemma_flags(folder: Path) -> dict[str, Any]:
    return {"score_format": "bge-reranker-v2-gemma"}


def prepare_for_model(
    first_ids: list[int], second_ids: list[int], *, truncation: str, max_length: int, **_: Any
) -> dict[str, list[int]]:
    """transformers 4's PreTrainedTokenizerBase.prepare_for_model as the packages call it (no special tokens, no
    padding, truncation="only_second", cut from the right), which transformers 5 no longer has; FlagEmbedding's
    prepare_for_model_compat writes the same rule for transformers 5."""
    assert truncation == "only_second"
    excess = len(first_ids) + len(second_ids) - max_length
    if 0 < excess < len(second_ids):
        second_ids = second_ids[:-excess]
    return {"input_ids": list(first_ids) + list(second_ids)}


def mxbai_scores(folder: Path, pairs: Sequence[tuple[str, str]], instruction: str | None = None) -> list[float]:
    """The mxbai-rerank package's MxbaiRerankV2.predict (what its rank() ranks by), in float32 on the CPU."""
    from mxbai_rerank import MxbaiRerankV2

    with warnings.catch_warnings():  # it loads with torch_dtype=, which transformers 5 renamed dtype and warns of
        warnings.simplefilter("ignore")
        model = MxbaiRerankV2(str(folder), device="cpu", torch_dtype=torch.float32)
    model.tokenizer.prepare_for_model = prepare_for_model
    queries, documents = [query for query, _ in pairs], [document for _, document in pairs]
    with warnings.catch_warnings():  # pad() names a max_length that padding="longest" ignores, and says so
        warnings.filterwarnings("ignore", "`max_length` is ignored", UserWarning)
        scores = model.predict(queries, documents, instruction=instruction)
    return scores.tolist()  # type: ignore[no-any-return]


GEMMA_PROMPT = (
    "Given a query A and a passage B, determine whether the passage contains an answer to the query by providing a "
    "prediction of either 'Yes' or 'No'."
)


def gemma_scores(
    folder: Path, pairs: Sequence[tuple[str, str]], *, max_length: int = 512, normalize: bool = False
) -> list[float]:
    """FlagEmbedding 1.4.2's FlagLLMReranker.compute_score (BaseLLMReranker.compute_score_single_gpu without the
    data loader; get_detailed_inputs' "A: " and "B: "), transcribed, in float32 on the CPU."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    yes_loc = tokenizer("Yes", add_special_tokens=False)["input_ids"][0]
    query_max_length = max_length * 3 // 4
    queries = tokenizer(
        [f"A: {query}" for query, _ in pairs], return_tensors=None, add_special_tokens=False,
        max_length=query_max_length, truncation=True,
    )["input_ids"]  # fmt: skip
    passages = tokenizer(
        [f"B: {passage}" for _, passage in pairs], return_tensors=None, add_special_tokens=False,
        max_length=max_length, truncation=True,
    )["input_ids"]  # fmt: skip
    order = np.argsort([-len(q) - len(p) for q, p in zip(queries, passages, strict=True)])
    prompt_inputs = tokenizer(GEMMA_PROMPT, return_tensors=None, add_special_tokens=False)["input_ids"]
    sep_inputs = tokenizer("\n", return_tensors=None, add_special_tokens=False)["input_ids"]
    encode_max_length = max_length + len(sep_inputs) + len(prompt_inputs)
    batch: list[list[int]] = []
    for i in order:
        first = queries[i]
        if tokenizer.bos_token_id is not None and tokenizer.bos_token_id != tokenizer.pad_token_id:
            first = [tokenizer.bos_token_id, *first]
        item = prepare_for_model(
            first, sep_inputs + passages[i], truncation="only_second", max_length=encode_max_length
        )
        batch.append(item["input_ids"] + sep_inputs + prompt_inputs)
    inputs = tokenizer.pad(
        {"input_ids": batch, "attention_mask": [[1] * len(ids) for ids in batch]},
        padding=True, pad_to_multiple_of=8, return_tensors="pt",
    )  # fmt: skip
    with torch.no_grad():
        logits = model(**inputs, output_hidden_states=True).logits
    mask = inputs["attention_mask"]
    if mask[:, -1].sum() == mask.shape[0]:  # last_logit_pool
        last = logits[:, -1, :]
    else:
        last = logits[torch.arange(len(batch)), mask.sum(dim=1) - 1, :]
    sorted_scores = last[:, yes_loc].float().tolist()
    scores = [sorted_scores[int(j)] for j in np.argsort(order)]
    return [float(1 / (1 + np.exp(-score))) for score in scores] if normalize else scores
