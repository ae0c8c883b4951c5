"""bge-m3 (BAAI/bge-m3) in its real layout, and its reference, FlagEmbedding's BGEM3FlagModel.

The folder: a tiny random XLMRobertaModel under an XLM-RoBERTa tokenizer (a Unigram vocabulary trained here, with
XLM-RoBERTa's special tokens and template), Sentence-Transformers files for the dense vector (CLS, normalized), and
`colbert_linear.pt` and `sparse_linear.pt` beside them, written by FlagEmbedding's own `save`.

The reference is FlagEmbedding 1.4.2's class itself (installed with --no-deps: `make install`). Its package
`__init__` imports every model FlagEmbedding has, and its MiniCPM layer-wise reranker imports
`transformers.modeling_attn_mask_utils`, which transformers 5 removed; so the two package modules above the
encoder-only embedders are put in place as empty packages and `FlagEmbedding.inference.embedder.encoder_only` (which
exports BGEM3FlagModel) is imported as it is, with everything it imports itself.
"""

from __future__ import annotations

import importlib.util
import json
import sys
import types
from pathlib import Path
from typing import Any

import torch

from bench.harness.corpus import make_sentences
from bench.harness.models import TINY

# The folder's maximum length (XLM-RoBERTa's positions start after the padding id: 130 positions, 128 tokens).
M3_MAX_LENGTH = 128
# The packages whose __init__ imports more than the encoder-only embedders (see the module's docstring).
BYPASSED_PACKAGES = ("FlagEmbedding", "FlagEmbedding.inference", "FlagEmbedding.inference.embedder")


def xlm_roberta_tokenizer(folder: Path) -> Any:
    """XLM-RoBERTa's tokenizer in shape (<s> text </s>; <s>, <pad>, </s>, <unk> first and <mask> last, as in bge-m3's
    250,002 entries), over a small Unigram vocabulary trained here."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers
    from transformers import XLMRobertaTokenizer

    unigram = Tokenizer(models.Unigram())
    unigram.normalizer = normalizers.NFKC()
    unigram.pre_tokenizer = pre_tokenizers.Metaspace()
    special = ["<s>", "<pad>", "</s>", "<unk>"]
    trainer = trainers.UnigramTrainer(vocab_size=2000, special_tokens=special, unk_token="<unk>", show_progress=False)
    unigram.train_from_iterator(make_sentences(600, seed=11), trainer)
    vocab = [(piece, float(score)) for piece, score in json.loads(unigram.to_str())["model"]["vocab"]]
    tokenizer = XLMRobertaTokenizer(vocab=vocab)
    assert tokenizer.convert_tokens_to_ids(special) == [0, 1, 2, 3]
    tokenizer.save_pretrained(folder)
    return tokenizer


def build_bge_m3(folder: Path) -> None:
    """BAAI/bge-m3's files: the XLM-RoBERTa and its tokenizer, Transformer -> Pooling(cls) -> Normalize
    (sentence-transformers' save), and the ColBERT (hidden -> hidden) and sparse (hidden -> 1) heads saved by
    FlagEmbedding's EncoderOnlyEmbedderM3Model.save."""
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.base.modules import Transformer
    from sentence_transformers.sentence_transformer.modules import Normalize, Pooling
    from transformers import XLMRobertaConfig, XLMRobertaModel

    base = folder.parent / f"{folder.name}-base"
    tokenizer = xlm_roberta_tokenizer(base)
    torch.manual_seed(33)
    # Weights far from transformers' tiny initial ones: at those, a random encoder gives every text nearly the same
    # CLS vector (cosines of 0.9999 between unrelated texts), whose order float noise decides.
    config = XLMRobertaConfig(
        vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id, bos_token_id=0, eos_token_id=2,
        max_position_embeddings=M3_MAX_LENGTH + 2, initializer_range=0.5, **TINY,
    )  # fmt: skip
    model = XLMRobertaModel(config).eval()
    model.save_pretrained(base)
    hidden = TINY["hidden_size"]
    modules = [Transformer(str(base), max_seq_length=M3_MAX_LENGTH), Pooling(hidden, pooling_mode="cls"), Normalize()]
    SentenceTransformer(modules=modules, device="cpu").save(str(folder))
    heads = {
        "model": model,
        "colbert_linear": torch.nn.Linear(hidden, hidden),
        "sparse_linear": torch.nn.Linear(hidden, 1),
    }
    # FlagEmbedding's own save: the model again (the same weights), and the two heads' state dicts.
    m3_model_class()(heads, tokenizer=tokenizer).save(str(folder))


def import_encoder_only() -> Any:
    """FlagEmbedding.inference.embedder.encoder_only, past the package __init__s transformers 5 cannot import."""
    if "FlagEmbedding.inference.embedder.encoder_only" not in sys.modules:
        for name in BYPASSED_PACKAGES:
            if name in sys.modules:
                continue
            spec = importlib.util.find_spec(name)
            assert spec is not None and spec.submodule_search_locations is not None, f"{name} is not installed"
            package = types.ModuleType(name)
            package.__spec__ = spec
            package.__path__ = list(spec.submodule_search_locations)
            package.__file__ = spec.origin
            sys.modules[name] = package
    from FlagEmbedding.inference.embedder import encoder_only

    return encoder_only


def m3_model_class() -> Any:
    import_encoder_only()
    from FlagEmbedding.finetune.embedder.encoder_only.m3 import EncoderOnlyEmbedderM3Model

    return EncoderOnlyEmbedderM3Model


def bge_m3_reference(folder: Path) -> Any:
    """BGEM3FlagModel on the folder, in float32 on the CPU, cutting at the folder's maximum length."""
    model = import_encoder_only().BGEM3FlagModel(
        str(folder), use_fp16=False, devices="cpu", query_max_length=M3_MAX_LENGTH, passage_max_length=M3_MAX_LENGTH
    )
    return model
