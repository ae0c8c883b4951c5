"""The model layouts of docs/models.md: tiny random models saved in each real layout, and what poolserve does
with each (served, held to the reference library; or refused at start with a documented sentence).

Every folder is written by the library its users save with (sentence-transformers' own `save`,
transformers' `save_pretrained`), except the layouts of older sentence-transformers releases, written as
those releases wrote them (which 6.2 still loads: it is the reference). Each case's `id` is its row in
docs/models.md (tests/fidelity/test_models_doc.py holds the two together).
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from bench.harness.llm_reranker import bpe_tokenizer, qwen3_config
from bench.harness.models import TINY, bundled_model_folder
from tests.fidelity.bge_m3_layouts import build_bge_m3
from tests.fidelity.compare import TEXTS
from tests.fidelity.format_layouts import build_bge_reranker_v2_gemma, build_mxbai_rerank_v2, gemma_flags, mxbai_flags
from tests.fidelity.image_text_layouts import (
    build_siglip,
    build_siglip2_naflex,
    build_siglip_left_padded,
    build_siglip_sentencepiece,
    build_siglip_unmasked,
)
from tests.fidelity.jina_bert_layout import build_jina_bert_own_code, computed_buffers
from tests.fidelity.legacy_st_files import write_legacy_st_files
from tests.fidelity.own_code_layouts import (
    NOMIC,
    build_gte_new_code_and_checkpoint_apart,
    build_gte_new_for_older_transformers,
    build_gte_new_own_code,
    build_gte_qwen2_own_code,
    build_nomic_code_elsewhere,
    build_nomic_own_code,
)
from tests.fidelity.reranker_layouts import (
    build_logit_score,
    build_one_token_logit_score,
    build_qwen3_reranker_card,
    build_sequence_classification_template,
    qwen3_card_flags,
)

HIDDEN = TINY["hidden_size"]
QUERY_PROMPT = "query: "
DOCUMENT_PROMPT = "passage: "
# Qwen3-Embedding's prompt shape: an instruction, a newline, then the query.
INSTRUCTION = "Instruct: Given a web search query, retrieve relevant passages\nQuery:"
# INSTRUCTOR's instructions, which its Pooling leaves out.
INSTRUCTOR_QUERY = "Represent the Wikipedia question for retrieving supporting documents: "
INSTRUCTOR_DOCUMENT = "Represent the Wikipedia document for retrieval: "


@dataclass(frozen=True)
class Served:
    """A layout poolserve serves; `reference` says how the reference library is asked (see test_served.py)."""

    id: str
    build: Callable[[Path], None]
    # "encode": SentenceTransformer.encode; "one_by_one": each text alone; "cross": CrossEncoder.predict; "llm": an
    # LLM reranker against CrossEncoder.predict; "qwen3_card": against the Qwen3-Reranker card's code; "sparse":
    # SparseEncoder.encode; "mxbai": the mxbai-rerank package; "gemma": FlagLLMReranker.compute_score (transcribed);
    # "image_text": transformers' get_text_features / get_image_features through the folder's AutoProcessor
    # "bge_m3": FlagEmbedding's BGEM3FlagModel
    reference: str = "encode"
    flags: dict[str, Any] = field(default_factory=dict)
    # Flags that name files the build writes beside the folder.
    folder_flags: Callable[[Path], dict[str, Any]] | None = None
    # The reference's transformer made the model its own code builds, where transformers 5's loading leaves it
    # otherwise (a buffer its code computes at construction comes back uninitialised: see own_code.py).
    as_built: Callable[[Any], None] | None = None

    def flags_for(self, folder: Path) -> dict[str, Any]:
        return {**self.flags, **(self.folder_flags(folder) if self.folder_flags else {})}


@dataclass(frozen=True)
class Refused:
    id: str
    build: Callable[[Path], None]
    message: str  # what `launch` prints after "cannot be served exactly: " (or the whole error)
    flags: dict[str, Any] = field(default_factory=dict)


def tiny_bert(folder: Path, seed: int = 10, tokenizer: Path | None = None) -> Path:
    from transformers import AutoTokenizer, BertConfig, BertModel

    torch.manual_seed(seed)
    BertModel(BertConfig(vocab_size=30522, max_position_embeddings=128, **TINY)).eval().save_pretrained(folder)
    AutoTokenizer.from_pretrained(tokenizer or bundled_model_folder()).save_pretrained(folder)
    return folder


def st_model(folder: Path, *modules: Any, **kwargs: Any) -> None:
    from sentence_transformers import SentenceTransformer

    SentenceTransformer(modules=list(modules), device="cpu", **kwargs).save(str(folder))


def transformer(folder: Path, seed: int = 10, **kwargs: Any) -> Any:
    from sentence_transformers.base.modules import Transformer

    return Transformer(str(tiny_bert(folder.parent / f"{folder.name}-base", seed)), **kwargs)


def pooling(mode: str | tuple[str, ...], **kwargs: Any) -> Any:
    from sentence_transformers.sentence_transformer.modules import Pooling

    return Pooling(HIDDEN, pooling_mode=mode, **kwargs)


def normalize() -> Any:
    from sentence_transformers.sentence_transformer.modules import Normalize

    return Normalize()


def dense(in_features: int, out_features: int, activation: torch.nn.Module | None, **kwargs: Any) -> Any:
    from sentence_transformers.base.modules import Dense

    torch.manual_seed(in_features * 100 + out_features)
    return Dense(in_features, out_features, activation_function=activation, **kwargs)


# Served --------------------------------------------------------------------------------------------


def build_mean_normalize(folder: Path) -> None:
    st_model(folder, transformer(folder), pooling("mean"), normalize())


def build_dense_chain_with_prompts(folder: Path) -> None:
    """LaBSE's, stella's, EmbeddingGemma's shape: pooled, projected by Dense modules, normalized; e5's prompts."""
    st_model(
        folder, transformer(folder), pooling("mean"), dense(HIDDEN, 24, torch.nn.Tanh()), dense(24, 16, None),
        normalize(), prompts={"query": QUERY_PROMPT, "document": DOCUMENT_PROMPT}, default_prompt_name="query",
    )  # fmt: skip


def build_dense_residual(folder: Path) -> None:
    st_model(
        folder, transformer(folder), pooling("cls"), dense(HIDDEN, HIDDEN, torch.nn.GELU(), use_residual=True),
        dense(HIDDEN, 12, torch.nn.ReLU(), use_residual=True),
    )  # fmt: skip


def build_layer_norm(folder: Path) -> None:
    from sentence_transformers.sentence_transformer.modules import LayerNorm

    norm = LayerNorm(HIDDEN)
    torch.manual_seed(11)
    with torch.no_grad():  # a trained norm's scale and shift, not the identity it starts as
        norm.norm.weight.uniform_(0.5, 1.5)
        norm.norm.bias.uniform_(-0.5, 0.5)
    st_model(folder, transformer(folder), pooling("mean"), norm)


def pooling_builder(mode: str | tuple[str, ...]) -> Callable[[Path], None]:
    def build(folder: Path) -> None:
        st_model(folder, transformer(folder), pooling(mode))

    return build


def build_lowercase(folder: Path) -> None:
    """do_lower_case over a cased tokenizer: sentence-transformers puts a Lowercase normalizer first."""
    cased = folder.parent / f"{folder.name}-cased-tokenizer"
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(bundled_model_folder())
    tokenizer.save_pretrained(cased)
    spec = json.loads((cased / "tokenizer.json").read_text())
    spec["normalizer"]["lowercase"] = False
    (cased / "tokenizer.json").write_text(json.dumps(spec))
    from sentence_transformers.base.modules import Transformer

    base = tiny_bert(folder.parent / f"{folder.name}-base", tokenizer=cased)
    shutil.copy(cased / "tokenizer.json", base / "tokenizer.json")
    st_model(folder, Transformer(str(base), do_lower_case=True), pooling("mean"), normalize())


def build_legacy_layout(folder: Path) -> None:
    """sentence-transformers 2.x: `sentence_transformers.models.X` types, boolean pooling keys, and
    max_seq_length in sentence_bert_config.json (shorter than the tokenizer's own 512)."""
    tiny_bert(folder)
    write_legacy_st_files(folder, pooling="max_tokens", max_seq_length=12, version="2.2.2")


def build_decoder_last_token(folder: Path) -> None:
    """Qwen3-Embedding's shape: a Qwen3 decoder, last-token pooling, normalized, an instruction prompt for
    queries and none for documents."""
    from sentence_transformers.base.modules import Transformer
    from transformers import AutoTokenizer, Qwen3Config, Qwen3Model

    base = folder.parent / f"{folder.name}-base"
    torch.manual_seed(12)
    config = Qwen3Config(
        vocab_size=30522, max_position_embeddings=128, num_key_value_heads=2, head_dim=8, pad_token_id=0, **TINY
    )
    Qwen3Model(config).eval().save_pretrained(base)
    AutoTokenizer.from_pretrained(bundled_model_folder()).save_pretrained(base)
    st_model(
        folder, Transformer(str(base)), pooling("lasttoken"), normalize(),
        prompts={"query": INSTRUCTION, "document": ""},
    )  # fmt: skip


def build_include_prompt_false(folder: Path) -> None:
    """INSTRUCTOR's shape: the instruction (a prompt) is read by the encoder but left out of pooling, here by every
    pooling mode at once (CLS then the first token after the prompt); a default prompt, and prompts per role."""
    st_model(
        folder, transformer(folder), pooling(("cls", "max", "mean", "weightedmean"), include_prompt=False),
        normalize(), prompts={"query": INSTRUCTOR_QUERY, "document": INSTRUCTOR_DOCUMENT},
        default_prompt_name="query",
    )  # fmt: skip


def build_router(folder: Path) -> None:
    """sentence-transformers 6's Router.for_query_document: a query encoder and a document encoder of their own (here
    mean pooling for queries, CLS and a Dense for documents), a Normalize after both; a text with no task takes the
    document's route (its default_route)."""
    from sentence_transformers.base.modules import Router

    query = [transformer(folder, 14), pooling("mean")]
    document = [
        transformer(folder.parent / f"{folder.name}-documents", 15),
        pooling("cls"),
        dense(HIDDEN, HIDDEN, torch.nn.Tanh()),
    ]
    st_model(
        folder, Router.for_query_document(query, document), normalize(),
        prompts={"query": QUERY_PROMPT, "document": DOCUMENT_PROMPT},
    )  # fmt: skip


def build_router_shared_transformer(folder: Path) -> None:
    """The older Asym shape in a Router: one Transformer and Pooling shared by both routes (saved once), a Dense of
    each route's own; texts with no task take the query's route (default_route "query"); the Pooling leaves the
    prompt out."""
    from sentence_transformers.base.modules import Router

    encoder, pooled = transformer(folder, 16), pooling("mean", include_prompt=False)
    routes = {
        "query": [encoder, pooled, dense(HIDDEN, 12, torch.nn.Tanh())],
        "document": [encoder, pooled, dense(HIDDEN, 12, None)],
    }
    st_model(
        folder, Router(routes, default_route="query"),
        prompts={"query": INSTRUCTOR_QUERY, "document": INSTRUCTOR_DOCUMENT},
    )  # fmt: skip


# A chat model's template (ChatML), which reads the `task` sentence-transformers sets for a query and ends with the
# end-of-text token a last-token embedder pools (Qwen3-Embedding's shape).
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message.role }}\n{{ message.content }}<|im_end|>\n{% endfor %}"
    "{% if task == 'query' %}<|im_start|>query\n{% endif %}<|endoftext|>"
)


def build_plain_chat_template(folder: Path) -> None:
    """A causal language model saved by transformers with no Sentence-Transformers files, whose tokenizer has a chat
    template: sentence-transformers 6 renders every text through it (served with --pooling last, as
    sentence-transformers pools a *ForCausalLM)."""
    from transformers import Qwen3ForCausalLM

    tokenizer = bpe_tokenizer(folder)
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(folder)
    torch.manual_seed(26)
    Qwen3ForCausalLM(qwen3_config(tokenizer)).eval().save_pretrained(folder)


def build_st_chat_template(folder: Path) -> None:
    """The same model saved by sentence-transformers 6 (its Transformer saves the "message" modality), last-token
    pooled and normalized, with a query prompt (rendered as a system message, not put before the text)."""
    from sentence_transformers.base.modules import Transformer

    base = folder.parent / f"{folder.name}-base"
    build_plain_chat_template(base)
    st_model(
        folder, Transformer(str(base)), pooling("lasttoken"), normalize(),
        prompts={"query": "Represent this search query: ", "document": ""},
    )  # fmt: skip


def build_dot_similarity(folder: Path) -> None:
    """msmarco-bert-base-dot's shape: CLS pooling, no normalization, scored by the dot product."""
    st_model(folder, transformer(folder), pooling("cls"), similarity_fn_name="dot")


def cross_encoder_builder(activation: torch.nn.Module) -> Callable[[Path], None]:
    def build(folder: Path) -> None:
        from sentence_transformers import CrossEncoder
        from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification

        base = folder.parent / f"{folder.name}-base"
        torch.manual_seed(13)
        config = BertConfig(vocab_size=30522, max_position_embeddings=128, num_labels=1, **TINY)
        BertForSequenceClassification(config).eval().save_pretrained(base)
        AutoTokenizer.from_pretrained(bundled_model_folder()).save_pretrained(base)
        CrossEncoder(str(base), device="cpu", activation_fn=activation).save(str(folder))

    return build


def build_static_embedding(folder: Path) -> None:
    """potion's shape (model2vec): the mean of trained token vectors, normalized, with prompts."""
    from sentence_transformers.sentence_transformer.modules import StaticEmbedding
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(bundled_model_folder() / "tokenizer.json"))
    torch.manual_seed(19)
    st_model(
        folder, StaticEmbedding(tokenizer, embedding_dim=16), normalize(), prompts={"query": QUERY_PROMPT},
        default_prompt_name="query",
    )  # fmt: skip


def build_model2vec_layout(folder: Path) -> None:
    """model2vec's own weights (`embeddings`, a token `mapping` and per-token `weights`) in an older
    sentence-transformers layout (the module in 0_StaticEmbedding/), a Dense after it."""
    from safetensors.torch import save_file

    module = folder / "0_StaticEmbedding"
    module.mkdir(parents=True)
    shutil.copy(bundled_model_folder() / "tokenizer.json", module / "tokenizer.json")
    vocab = json.loads((module / "tokenizer.json").read_text())["model"]["vocab"]
    generator = torch.Generator().manual_seed(20)
    rows = 1000
    save_file(
        {
            "embeddings": torch.randn(rows, 16, generator=generator),
            "mapping": torch.randint(0, rows, (len(vocab),), generator=generator),
            "weights": torch.rand(len(vocab), generator=generator) + 0.5,
        },
        str(module / "model.safetensors"),
    )
    modules = [
        {"idx": 0, "name": "0", "path": "0_StaticEmbedding", "type": "sentence_transformers.models.StaticEmbedding"},
        {"idx": 1, "name": "1", "path": "1_Dense", "type": "sentence_transformers.models.Dense"},
    ]
    (folder / "modules.json").write_text(json.dumps(modules))
    (folder / "1_Dense").mkdir()
    dense_config = {"in_features": 16, "out_features": 8, "bias": True,
                    "activation_function": "torch.nn.modules.activation.Tanh"}  # fmt: skip
    (folder / "1_Dense" / "config.json").write_text(json.dumps(dense_config))
    save_file(
        {"linear.weight": torch.randn(8, 16, generator=generator), "linear.bias": torch.randn(8, generator=generator)},
        str(folder / "1_Dense" / "model.safetensors"),
    )


def masked_lm(folder: Path, seed: int, architecture: str = "bert", active: float = 0.0005) -> Path:
    """A tiny random masked LM (BERT's; XLM-RoBERTa's; or DistilBERT's, whose MLM head poolserve runs as the whole
    model does) beside the bundled model's tokenizer. Its vocabulary logits are shifted down until about `active` of
    them are positive, as a trained SPLADE's are: a random head's are half positive, and every text's sparse vector
    then held nearly all 30,522 entries, where a real one holds tens to hundreds."""
    from transformers import (
        AutoTokenizer,
        BertConfig,
        BertForMaskedLM,
        DistilBertConfig,
        DistilBertForMaskedLM,
        XLMRobertaConfig,
        XLMRobertaForMaskedLM,
    )

    base = folder.parent / f"{folder.name}-base"
    torch.manual_seed(seed)
    model: Any
    if architecture == "distilbert":
        config = DistilBertConfig(
            vocab_size=30522, max_position_embeddings=128, dim=HIDDEN, n_layers=TINY["num_hidden_layers"],
            n_heads=TINY["num_attention_heads"], hidden_dim=TINY["intermediate_size"],
        )  # fmt: skip
        model = DistilBertForMaskedLM(config)
    elif architecture == "xlm-roberta":
        # The BERT tokenizer pads with 0; RoBERTa's positions count from the padding id on (130: 128 tokens).
        roberta = XLMRobertaConfig(vocab_size=30522, max_position_embeddings=130, pad_token_id=0, **TINY)
        model = XLMRobertaForMaskedLM(roberta)
    else:
        model = BertForMaskedLM(BertConfig(vocab_size=30522, max_position_embeddings=128, **TINY))
    model.eval()
    tokenizer = AutoTokenizer.from_pretrained(bundled_model_folder())
    with torch.no_grad():
        encoded = tokenizer(TEXTS, padding=True, return_tensors="pt")
        logits = model(input_ids=encoded["input_ids"], attention_mask=encoded["attention_mask"]).logits
        # The head's bias (its decoder's, tied to it) lowered by one number for every vocabulary entry.
        model.get_output_embeddings().bias -= torch.quantile(logits.flatten(), 1 - active)
    model.save_pretrained(base)
    tokenizer.save_pretrained(base)
    return base


def build_splade_max(folder: Path) -> None:
    """naver/splade-v3's shape as sentence-transformers 6 saves it: a Transformer with transformer_task
    "fill-mask", SpladePooling max over log1p(relu(logits)); query and document prompts."""
    from sentence_transformers import SparseEncoder
    from sentence_transformers.sparse_encoder.modules import SpladePooling, Transformer

    transformer = Transformer(str(masked_lm(folder, 17)), transformer_task="fill-mask", max_seq_length=64)
    SparseEncoder(
        modules=[transformer, SpladePooling("max")], device="cpu",
        prompts={"query": QUERY_PROMPT, "document": DOCUMENT_PROMPT},
    ).save(str(folder))  # fmt: skip


def build_splade_sum_mlm_transformer(folder: Path) -> None:
    """sentence-transformers 5's MLMTransformer module, SpladePooling sum of log1p(log1p(relu(logits)))
    (OpenSearch's "log1p_relu") in chunks, max_active_dims (the most non-zero values a vector keeps), and the
    cosine for similarity (of the vectors max_active_dims leaves)."""
    from sentence_transformers import SparseEncoder
    from sentence_transformers.sparse_encoder.modules import MLMTransformer, SpladePooling

    pooling = SpladePooling("sum", activation_function="log1p_relu", chunk_size=4)
    # Denser than the others (2 % of each token's logits positive): its max_active_dims has more to cut.
    modules = [MLMTransformer(str(masked_lm(folder, 21, active=0.02))), pooling]
    model = SparseEncoder(modules=modules, device="cpu", similarity_fn_name="cosine")
    model.max_active_dims = 300
    model.save(str(folder))


def build_splade_xlm_roberta(folder: Path) -> None:
    """A multilingual SPLADE's shape: an XLM-RoBERTa masked LM (its `lm_head` run on the real tokens), SpladePooling
    max, `max_seq_length` 96."""
    from sentence_transformers import SparseEncoder
    from sentence_transformers.sparse_encoder.modules import SpladePooling, Transformer

    base = masked_lm(folder, 25, "xlm-roberta")
    transformer = Transformer(str(base), transformer_task="fill-mask", max_seq_length=96)
    SparseEncoder(modules=[transformer, SpladePooling("max")], device="cpu").save(str(folder))


def build_inference_free_splade(folder: Path) -> None:
    """opensearch's inference-free SPLADE (neural-sparse-encoding-doc-v3-distill's shape): a Router of trained per-token
    weights for queries (SparseStaticEmbedding, the document encoder's tokenizer) and SPLADE (max of log1p_relu) for
    documents, texts with no task taking the document's route; a query prompt, which the query route reads too."""
    from sentence_transformers import SparseEncoder
    from sentence_transformers.base.modules import Router
    from sentence_transformers.sparse_encoder.modules import SparseStaticEmbedding, SpladePooling, Transformer
    from transformers import AutoTokenizer

    base = masked_lm(folder, 23)
    torch.manual_seed(25)
    weights = torch.rand(30522) * 3  # IDF-like: every token its own positive weight
    query = SparseStaticEmbedding(AutoTokenizer.from_pretrained(base, model_max_length=128), weight=weights)
    document = [
        Transformer(str(base), transformer_task="fill-mask"),
        SpladePooling("max", activation_function="log1p_relu"),
    ]
    SparseEncoder(
        modules=[Router.for_query_document([query], document)], device="cpu", similarity_fn_name="dot",
        prompts={"query": QUERY_PROMPT},
    ).save(str(folder))  # fmt: skip


def build_splade_distilbert(folder: Path) -> None:
    """splade-v3-distilbert's shape: a DistilBERT masked LM, SpladePooling max."""
    from sentence_transformers import SparseEncoder
    from sentence_transformers.sparse_encoder.modules import SpladePooling, Transformer

    transformer = Transformer(str(masked_lm(folder, 22, "distilbert")), transformer_task="fill-mask")
    SparseEncoder(modules=[transformer, SpladePooling("max")], device="cpu").save(str(folder))


# Architectures beyond BERT, run packed on a CPU (engine_core/packed_encoder.py) ----------------------------------
# RoBERTa's, XLM-RoBERTa's and MPNet's positions count from their padding id + 1 (2 here, as theirs): 130 places
# hold the tokenizer's 128 tokens. ModernBERT's local window (16 places: 8 either side) is shorter than most test
# texts, so both its global and its local layers are held.
ROBERTA_POSITIONS = 130


def roberta_tokenizer(folder: Path) -> Any:
    """XLM-RoBERTa's (and MPNet's) tokenizer shape, trained here (no hub): a Unigram over Metaspace pieces, <s> 0,
    <pad> 1, </s> 2, <unk> 3, a text as `<s> A </s>` and a pair as `<s> A </s></s> B </s>`, 128 tokens at most."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    from bench.harness.corpus import make_sentences

    specials = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]
    tokenizer = Tokenizer(models.Unigram())
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace()
    tokenizer.decoder = decoders.Metaspace()
    trainer = trainers.UnigramTrainer(vocab_size=1500, special_tokens=specials, unk_token="<unk>", show_progress=False)
    tokenizer.train_from_iterator(make_sentences(400, seed=9), trainer)
    tokenizer.post_processor = processors.TemplateProcessing(
        single="<s> $A </s>", pair="<s> $A </s> </s> $B </s>", special_tokens=[("<s>", 0), ("</s>", 2)]
    )
    fast = PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
        tokenizer_object=tokenizer, bos_token="<s>", eos_token="</s>", cls_token="<s>", sep_token="</s>",
        pad_token="<pad>", unk_token="<unk>", mask_token="<mask>", model_max_length=ROBERTA_POSITIONS - 2,
    )  # fmt: skip
    fast.save_pretrained(folder)
    return fast


def encoder_base(folder: Path, architecture: str, seed: int, classifier: bool = False) -> Path:
    """A tiny random XLM-RoBERTa (bge-m3's, multilingual-e5's, bge-reranker's), MPNet (all-mpnet's) or ModernBERT
    (gte-modernbert's, modernbert-embed's) beside its tokenizer in the architecture's shape (RoBERTa's for the first
    two, the bundled BERT tokenizer's for ModernBERT), as `classifier` its sequence classifier with one label."""
    import transformers

    base = folder.parent / f"{folder.name}-base"
    if architecture == "modernbert":
        transformers.AutoTokenizer.from_pretrained(bundled_model_folder()).save_pretrained(base)
        ids = {"pad_token_id": 0, "bos_token_id": 101, "eos_token_id": 102, "cls_token_id": 101, "sep_token_id": 102}
        config: Any = transformers.ModernBertConfig(
            vocab_size=30522, max_position_embeddings=128, local_attention=16, **ids, **TINY
        )
    else:
        tokenizer = roberta_tokenizer(base)
        sizes = {"vocab_size": len(tokenizer), "max_position_embeddings": ROBERTA_POSITIONS, "pad_token_id": 1}
        if architecture == "xlm-roberta":
            config = transformers.XLMRobertaConfig(type_vocab_size=1, bos_token_id=0, eos_token_id=2, **sizes, **TINY)
        else:
            config = transformers.MPNetConfig(bos_token_id=0, eos_token_id=2, **sizes, **TINY)
    config.num_labels = 1
    name = type(config).__name__.removesuffix("Config")
    torch.manual_seed(seed)
    model = getattr(transformers, f"{name}{'ForSequenceClassification' if classifier else 'Model'}")(config)
    model.eval().save_pretrained(base)
    return base


def build_xlm_roberta_cls(folder: Path) -> None:
    """bge-m3's dense embedder: XLM-RoBERTa, the first token's state, normalized."""
    from sentence_transformers.base.modules import Transformer

    st_model(folder, Transformer(str(encoder_base(folder, "xlm-roberta", 26))), pooling("cls"), normalize())


def build_mpnet_mean(folder: Path) -> None:
    """all-mpnet-base-v2's shape: MPNet (relative attention bias), mean pooling, normalized."""
    from sentence_transformers.base.modules import Transformer

    st_model(folder, Transformer(str(encoder_base(folder, "mpnet", 27))), pooling("mean"), normalize())


def build_modernbert_mean_prompts(folder: Path) -> None:
    """modernbert-embed's shape: ModernBERT (global and local layers, rotary positions), mean pooling, normalized,
    its `search_query: ` and `search_document: ` prompts."""
    from sentence_transformers.base.modules import Transformer

    st_model(
        folder, Transformer(str(encoder_base(folder, "modernbert", 28))), pooling("mean"), normalize(),
        prompts={"query": "search_query: ", "document": "search_document: "},
    )  # fmt: skip


def cross_encoder_over(architecture: str, seed: int) -> Callable[[Path], None]:
    """bge-reranker's shape (XLM-RoBERTa) or gte-reranker-modernbert's: a sequence classifier with one label, saved
    by sentence-transformers as a CrossEncoder (its default activation for one label, Sigmoid)."""

    def build(folder: Path) -> None:
        from sentence_transformers import CrossEncoder

        CrossEncoder(str(encoder_base(folder, architecture, seed, classifier=True)), device="cpu").save(str(folder))

    return build


# Late interaction (ColBERT) -----------------------------------------------------------------------------------


def multi_vector_model(folder: Path, transformer_options: dict[str, Any], *heads: Any, **kwargs: Any) -> None:
    """A MultiVectorEncoder saved by sentence-transformers 6: Transformer -> token heads -> MultiVectorMask ->
    (Normalize), as its ColBERT models are built."""
    from sentence_transformers import MultiVectorEncoder

    MultiVectorEncoder(modules=[transformer(folder, 18, **transformer_options), *heads], device="cpu", **kwargs).save(
        str(folder)
    )


def token_dense(in_features: int, out_features: int, activation: torch.nn.Module | None, **kwargs: Any) -> Any:
    return dense(in_features, out_features, activation, module_input_name="token_embeddings", **kwargs)


def multi_vector_mask(skiplist: list[str] | None) -> Any:
    from sentence_transformers.multi_vector_encoder.modules import MultiVectorMask

    return MultiVectorMask(skiplist_words=skiplist)


def build_colbert(folder: Path) -> None:
    """ColBERT as PyLate trains it, in sentence-transformers 6's layout: [Q]/[D] markers, queries expanded to a
    fixed 12 [MASK]-padded tokens the encoder does not attend to, documents cut at 40 tokens without punctuation,
    a bias-free projection, normalized vectors, MaxSim."""
    import string

    from sentence_transformers.base.modules import Normalize

    options = {"query_expansion": {"strategy": "fixed", "attend": False, "length": 12}, "document_length": 40}
    multi_vector_model(
        folder, options, token_dense(HIDDEN, 16, torch.nn.Identity(), bias=False),
        multi_vector_mask(list(string.punctuation)), Normalize(module_input_name="token_embeddings"),
        prompts={"query": "[Q] ", "document": "[D] "},
    )  # fmt: skip


def build_colbert_floor_expansion(folder: Path) -> None:
    """The other knobs: expansion as a floor ("min") that the encoder attends to, a query_length above it, two
    token heads (bias, Tanh), no skiplist, no Normalize, MeanMaxSim, and a default prompt for texts with no role."""
    options = {"query_expansion": {"strategy": "min", "attend": True, "length": 8}, "query_length": 20}
    multi_vector_model(
        folder, options, token_dense(HIDDEN, 24, torch.nn.Tanh()), token_dense(24, 12, torch.nn.Identity()),
        multi_vector_mask(None), prompts={"query": QUERY_PROMPT, "document": DOCUMENT_PROMPT},
        default_prompt_name="document", similarity_fn_name="meanmaxsim",
    )  # fmt: skip


def build_hf_colbert(folder: Path) -> None:
    """Stanford's ColBERT (colbert-ir/colbertv2.0), written as colbert-ai saves it: HF_ColBERT's BERT under `bert.`
    and its projection as `linear.weight` in one weights file, the config naming HF_ColBERT, and artifact.metadata
    with its markers and lengths (colbert-ai is not installed here: the folder is written by hand)."""
    from safetensors.torch import load_file, save_file

    tiny_bert(folder, 19)
    state = {f"bert.{name}": tensor for name, tensor in load_file(str(folder / "model.safetensors")).items()}
    state["linear.weight"] = torch.randn(16, HIDDEN, generator=torch.Generator().manual_seed(20))
    save_file(state, str(folder / "model.safetensors"))
    config = json.loads((folder / "config.json").read_text())
    config["architectures"] = ["HF_ColBERT"]
    (folder / "config.json").write_text(json.dumps(config))
    metadata = {"query_token_id": "[unused0]", "doc_token_id": "[unused1]", "query_maxlen": 12, "doc_maxlen": 40,
                "attend_to_mask_tokens": False, "mask_punctuation": True}  # fmt: skip
    (folder / "artifact.metadata").write_text(json.dumps(metadata))


def build_pylate(folder: Path, markers: tuple[str, str] = ("[Q] ", "[D] "), **settings: Any) -> None:
    """PyLate's ColBERT, written as PyLate 1.x saves it (PyLate pins sentence-transformers 5.3 and transformers
    <= 5.3, which this environment cannot hold): "[Q] " and "[D] " added to the tokenizer and the embeddings, a
    Transformer and `pylate.models.Dense.Dense` in modules.json, and PyLate's settings in
    config_sentence_transformers.json (model_type ColBERT, prefixes, lengths, expansion, skiplist)."""
    import string

    from safetensors.torch import save_file
    from transformers import AutoTokenizer, BertModel

    tiny_bert(folder, 21)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    if tokenizer.add_tokens([marker for marker in markers if marker not in tokenizer.get_vocab()]):
        model = BertModel.from_pretrained(folder)
        model.resize_token_embeddings(len(tokenizer))
        model.save_pretrained(folder)
        tokenizer.save_pretrained(folder)
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Dense", "type": "pylate.models.Dense.Dense"},
    ]
    (folder / "modules.json").write_text(json.dumps(modules))
    (folder / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 64, "do_lower_case": False}))
    (folder / "1_Dense").mkdir()
    dense_config = {"in_features": HIDDEN, "out_features": 16, "bias": False,
                    "activation_function": "torch.nn.modules.linear.Identity", "use_residual": False}  # fmt: skip
    (folder / "1_Dense" / "config.json").write_text(json.dumps(dense_config))
    weight = torch.randn(16, HIDDEN, generator=torch.Generator().manual_seed(22))
    save_file({"linear.weight": weight}, str(folder / "1_Dense" / "model.safetensors"))
    defaults = {
        "model_type": "ColBERT", "prompts": {"query": "", "document": ""}, "default_prompt_name": None,
        "similarity_fn_name": "MaxSim", "query_prefix": markers[0], "document_prefix": markers[1], "query_length": 12,
        "document_length": 40, "attend_to_expansion_tokens": False, "skiplist_words": list(string.punctuation),
        "do_query_expansion": True,
    }  # fmt: skip
    saved = {key: value for key, value in {**defaults, **settings}.items() if value is not None}
    (folder / "config_sentence_transformers.json").write_text(json.dumps(saved))


def build_pylate_stanford_markers(folder: Path) -> None:
    """PyLate's save of a model with Stanford's markers (answerai-colbert-small's shape): "[unused0]" and
    "[unused1]", which the vocabulary has but the tokenizer splits, expansion attended, and PyLate's defaults
    for what it left unsaid (a 32-token query, the punctuation skiplist, the model's maximum for documents)."""
    build_pylate(
        folder, ("[unused0]", "[unused1]"), attend_to_expansion_tokens=True, query_length=None, document_length=None,
        skiplist_words=None,
    )  # fmt: skip


SERVED = [
    Served("st-mean-normalize", build_mean_normalize),
    Served("st-dense-chain-prompts", build_dense_chain_with_prompts),
    Served("st-dense-residual", build_dense_residual),
    Served("st-layer-norm", build_layer_norm),
    Served("st-pooling-max", pooling_builder("max")),
    Served("st-pooling-mean-sqrt-len", pooling_builder("mean_sqrt_len_tokens")),
    Served("st-pooling-weightedmean", pooling_builder("weightedmean")),
    Served("st-pooling-lasttoken", pooling_builder("lasttoken")),
    Served("st-pooling-concatenated", pooling_builder(("cls", "max", "mean"))),
    Served("st-do-lower-case", build_lowercase),
    Served("st-legacy-layout", build_legacy_layout),
    Served("decoder-last-token-prompts", build_decoder_last_token, reference="one_by_one"),
    Served("st-include-prompt-false", build_include_prompt_false),
    Served("st-dot-similarity", build_dot_similarity),
    Served("plain-chat-template", build_plain_chat_template, reference="plain", flags={"pooling": "last"}),
    Served("st-chat-template", build_st_chat_template, reference="one_by_one"),
    Served("router", build_router),
    Served("router-shared-transformer", build_router_shared_transformer),
    Served("static-embedding", build_static_embedding),
    Served("static-model2vec-layout", build_model2vec_layout),
    Served("cross-encoder-identity", cross_encoder_builder(torch.nn.Identity()), reference="cross"),
    Served("cross-encoder-sigmoid", cross_encoder_builder(torch.nn.Sigmoid()), reference="cross"),
    Served("st-xlm-roberta-cls", build_xlm_roberta_cls),
    Served("st-mpnet-mean", build_mpnet_mean),
    Served("st-modernbert-mean-prompts", build_modernbert_mean_prompts),
    Served("cross-encoder-xlm-roberta", cross_encoder_over("xlm-roberta", 29), reference="cross"),
    Served("cross-encoder-modernbert", cross_encoder_over("modernbert", 30), reference="cross"),
    Served("llm-reranker-logit-score", build_logit_score, reference="llm"),
    Served("llm-reranker-one-token", build_one_token_logit_score, reference="llm"),
    Served("llm-reranker-seq-cls-template", build_sequence_classification_template, reference="llm"),
    Served(
        "qwen3-reranker-card-flags", build_qwen3_reranker_card, reference="qwen3_card", folder_flags=qwen3_card_flags
    ),
    Served("mxbai-rerank-v2-format", build_mxbai_rerank_v2, reference="mxbai", folder_flags=mxbai_flags),
    Served("bge-reranker-v2-gemma-format", build_bge_reranker_v2_gemma, reference="gemma", folder_flags=gemma_flags),
    Served("splade-max", build_splade_max, reference="sparse"),
    Served("splade-sum-mlm-transformer", build_splade_sum_mlm_transformer, reference="sparse"),
    Served("splade-xlm-roberta", build_splade_xlm_roberta, reference="sparse"),
    Served("splade-distilbert", build_splade_distilbert, reference="sparse"),
    Served("splade-inference-free", build_inference_free_splade, reference="sparse"),
    Served("colbert", build_colbert, reference="multi_vector"),
    Served("colbert-floor-expansion", build_colbert_floor_expansion, reference="multi_vector"),
    Served("hf-colbert", build_hf_colbert, reference="multi_vector"),
    Served("pylate", build_pylate, reference="multi_vector"),
    Served("pylate-stanford-markers", build_pylate_stanford_markers, reference="multi_vector"),
    Served("siglip", build_siglip, reference="image_text"),
    Served("siglip-left-padded", build_siglip_left_padded, reference="image_text"),
    Served("siglip-unmasked", build_siglip_unmasked, reference="image_text"),
    Served("bge-m3", build_bge_m3, reference="bge_m3"),
    Served("own-code-nomic-bert", build_nomic_own_code, flags={"trust_remote_code": True}),
    Served("own-code-gte-new", build_gte_new_own_code, flags={"trust_remote_code": True}),
    Served("own-code-gte-qwen2", build_gte_qwen2_own_code, flags={"trust_remote_code": True}),
    Served(
        "own-code-jina-bert", build_jina_bert_own_code, flags={"trust_remote_code": True}, as_built=computed_buffers
    ),
]


# Refused -------------------------------------------------------------------------------------------


def build_router_static_queries(folder: Path) -> None:
    """A static embedder for queries and a transformer for documents (the Router's own example)."""
    from sentence_transformers.base.modules import Router
    from sentence_transformers.sentence_transformer.modules import StaticEmbedding
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(bundled_model_folder() / "tokenizer.json"))
    query = [StaticEmbedding(tokenizer, embedding_dim=HIDDEN)]
    document = [transformer(folder, 17), pooling("mean")]
    st_model(folder, Router.for_query_document(query, document), normalize())


def build_custom_module(folder: Path) -> None:
    build_mean_normalize(folder)
    modules = json.loads((folder / "modules.json").read_text())
    modules[0]["type"] = "custom_st.Transformer"  # jina-embeddings-v3's shape: code shipped in the folder
    (folder / "modules.json").write_text(json.dumps(modules))


def build_causal_lm(folder: Path) -> None:
    """Qwen3-Reranker's layout: a causal language model and its tokenizer, no Sentence-Transformers files."""
    from transformers import AutoTokenizer, Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(16)
    config = Qwen3Config(vocab_size=30522, max_position_embeddings=128, num_key_value_heads=2, head_dim=8, **TINY)
    Qwen3ForCausalLM(config).eval().save_pretrained(folder)
    AutoTokenizer.from_pretrained(bundled_model_folder()).save_pretrained(folder)


def build_causal_lm_chat_template(folder: Path) -> None:
    """A bare causal model whose tokenizer's chat template is a chat model's (user and assistant turns only)."""
    from transformers import Qwen3ForCausalLM

    tokenizer = bpe_tokenizer(folder)
    tokenizer.chat_template = (
        "{% for message in messages %}{% if message.role in ['user', 'assistant'] %}<|im_start|>{{ message.role }}\n"
        "{{ message.content }}<|im_end|>\n{% endif %}{% endfor %}<|im_start|>assistant\n"
    )
    tokenizer.save_pretrained(folder)
    torch.manual_seed(24)
    Qwen3ForCausalLM(qwen3_config(tokenizer)).eval().save_pretrained(folder)


def build_csr(folder: Path) -> None:
    """A CSR model: a dense embedder's pooled vector made sparse by a SparseAutoEncoder."""
    from sentence_transformers import SparseEncoder
    from sentence_transformers.sparse_encoder.modules import SparseAutoEncoder

    torch.manual_seed(24)
    modules = [transformer(folder, 24), pooling("mean"), SparseAutoEncoder(HIDDEN, hidden_dim=64, k=8)]
    SparseEncoder(modules=modules, device="cpu").save(str(folder))


def build_token_dense(folder: Path) -> None:
    """A projection of every token's vector (ColBERT's, as PyLate saves it), not of the pooled row."""
    module = dense(HIDDEN, 8, None, module_input_name="token_embeddings")
    st_model(folder, transformer(folder), pooling("mean"), module)


def build_pylate_other_model_type(folder: Path) -> None:
    build_pylate(folder, model_type="SentenceTransformer")


def build_foreign_activation(folder: Path) -> None:
    build_dense_chain_with_prompts(folder)
    config_path = folder / "2_Dense" / "config.json"
    config = json.loads(config_path.read_text())
    config["activation_function"] = "my_package.activations.Swish"
    config_path.write_text(json.dumps(config))


def build_tokenizer_args(folder: Path) -> None:
    build_mean_normalize(folder)
    path = folder / "sentence_bert_config.json"
    config = json.loads(path.read_text())
    config["tokenizer_args"] = {"add_eos_token": True}
    path.write_text(json.dumps(config))


def build_own_code(folder: Path) -> None:
    """gte-Qwen2's shape: a config whose auto_map names the folder's own model code."""
    build_mean_normalize(folder)
    path = folder / "config.json"
    config = json.loads(path.read_text())
    config["auto_map"] = {"AutoModel": "modeling_bidirectional.BidirectionalBert"}
    path.write_text(json.dumps(config))


REFUSED = [
    Refused(
        "router-static-query-route",
        build_router_static_queries,
        "the Router's route 'query' begins with module query_0_StaticEmbedding "
        "(sentence_transformers.sentence_transformer.modules.static_embedding.StaticEmbedding); poolserve serves "
        "routes that are each a Transformer, a Pooling and heads",
    ),
    Refused(
        "custom-module",
        build_custom_module,
        "module 0 (custom_st.Transformer) is custom code, not one of sentence-transformers' own modules, which are "
        "all poolserve runs",
    ),
    Refused(
        "causal-lm-without-st-files",
        build_causal_lm,
        "Qwen3ForCausalLM is a causal language model with no Sentence-Transformers files saying how to use it: to "
        "serve it as a reranker scored from its logits, give --score-tokens (and --score-template unless its chat "
        "template renders query/document pairs), or --score-format for mxbai-rerank-v2 or bge-reranker-v2-gemma; as "
        "an embedder, --pooling last (or mean).",
    ),
    Refused(
        "score-format-on-a-cross-encoder",
        cross_encoder_builder(torch.nn.Sigmoid()),
        "--score-format applies to a causal language model (*ForCausalLM); this is a BertForSequenceClassification.",
        flags={"score_format": "mxbai-rerank-v2"},
    ),
    Refused(
        "score-format-on-a-logit-score-folder",
        build_logit_score,
        "--score-format mxbai-rerank-v2 reads a bare causal model's folder as its package does; this folder is a "
        "Sentence-Transformers model, served as its own modules say: drop --score-format.",
        flags={"score_format": "mxbai-rerank-v2"},
    ),
    Refused(
        "llm-reranker-chat-template-without-pair-roles",
        build_causal_lm_chat_template,
        "the tokenizer's chat template does not render a query/document pair (messages with the roles 'query' and "
        "'document'), so every pair would score alike; give --score-template FILE with one that does.",
        flags={"score_tokens": ["yes", "no"]},
    ),
    Refused(
        "sparse-csr",
        build_csr,
        "a SparseAutoEncoder module (a CSR model's sparse projection of a dense embedding) is not supported",
    ),
    Refused(
        "token-level-dense",
        build_token_dense,
        "the module 2_Dense (sentence_transformers.base.modules.dense.Dense) works on 'token_embeddings' (per-token "
        "vectors, as ColBERT's do); poolserve's heads work on the pooled sentence embedding",
    ),
    Refused(
        "pylate-other-model-type",
        build_pylate_other_model_type,
        "this folder holds PyLate's settings or modules under model_type 'SentenceTransformer'; poolserve serves "
        "PyLate's layout where config_sentence_transformers.json says model_type 'ColBERT', as PyLate saves it",
    ),
    Refused(
        "dense-foreign-activation",
        build_foreign_activation,
        "the Dense activation 'my_package.activations.Swish' is not a torch.nn module, the only kind poolserve runs",
    ),
    Refused(
        "own-code-without-trust",
        build_own_code,
        "the folder's config runs its own code for AutoModel (modeling_bidirectional.BidirectionalBert); give "
        "--trust-remote-code to run it.",
    ),
    Refused(
        "own-code-known-model-type-without-trust",
        build_jina_bert_own_code,
        "the folder's config runs its own code for AutoModel (modeling_bert.JinaBertModel); give "
        "--trust-remote-code to run it.",
    ),
    Refused(
        "own-code-in-another-repository",
        build_nomic_code_elsewhere,
        f"config.json's auto_map runs code from the repository {NOMIC.repository} "
        "(configuration_hf_nomic_bert.py, modeling_hf_nomic_bert.py), which is neither in the folder nor in the "
        "Hugging Face cache, and could not be fetched from a hub: copy those files into the folder and name them "
        'there without the repository ("AutoModel": "modeling_hf_nomic_bert.NomicBertModel"), or fetch '
        f"{NOMIC.repository} once where a hub is reachable.",
        flags={"trust_remote_code": True},
    ),
    Refused(
        "own-code-unknown-model-type-without-trust",
        build_gte_new_own_code,
        "the folder's config runs its own code for AutoConfig (configuration.NewConfig); give --trust-remote-code "
        "to run it.",
    ),
    Refused(
        "own-code-checkpoint-mismatch",
        build_gte_new_code_and_checkpoint_apart,
        "the folder's own code (modeling.NewModel) finds no weights in the checkpoint for 32 of its parameters "
        "(layers.0.mlp.down_proj.bias, layers.0.mlp.down_proj.weight, layers.0.mlp.gate_proj.weight, ...), which "
        "would run random: the code and the checkpoint do not match.",
        flags={"trust_remote_code": True},
    ),
    Refused(
        "own-code-for-older-transformers",
        build_gte_new_for_older_transformers,
        "the folder's own code (modeling.NewModel) fails on its first forward pass (AttributeError: 'NewModel' "
        "object has no attribute 'get_extended_attention_mask'): it may be written for another transformers release "
        "than the one installed",
        flags={"trust_remote_code": True},
    ),
    Refused(
        "siglip-sentencepiece-tokenizer",
        build_siglip_sentencepiece,
        "SiglipTokenizer (SigLIP's SentencePiece tokenizer, which lowercases and strips punctuation before it splits) "
        "has no fast tokenizer (tokenizer.json) that tokenizes as it does, and the API servers run only fast "
        "tokenizers; a SigLIP folder whose tokenizer is fast (SigLIP 2's fixed-resolution checkpoints) is served.",
    ),
    Refused(
        "siglip2-naflex",
        build_siglip2_naflex,
        "siglip2 (SigLIP 2 NaFlex, whose Siglip2ImageProcessor resizes each image to a patch grid of its own aspect "
        "ratio and masks the patches it pads) is not served, as poolserve sends every image of a model at one size; "
        "SigLIP 2's fixed-resolution checkpoints (model_type siglip) are.",
    ),
    Refused(
        "transformer-tokenizer-args",
        build_tokenizer_args,
        "sentence_bert_config.json sets tokenizer_args ['add_eos_token'], which poolserve does not apply",
    ),
]
