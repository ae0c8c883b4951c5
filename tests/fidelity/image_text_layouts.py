"""SigLIP in its real layouts: tiny random SiglipModel / Siglip2Model saved by transformers' `save_pretrained`, with
a SiglipImageProcessor's preprocessor_config.json and a tokenizer, and the reference they are held to: the model's
`get_text_features` / `get_image_features` on what transformers' processor makes of the texts and images, as the
model cards run them (texts padded to the maximum length, `padding="max_length"`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import torch

from bench.harness.corpus import make_sentences
from bench.harness.models import TINY

# SigLIP's texts are trained and padded at 64 tokens; 32x32 images in 8x8 patches keep the vision tower small.
TEXT_LENGTH = 64
IMAGE_SIZE = 32
GEMMA_SPECIALS = ["<pad>", "<eos>", "<bos>", "<unk>", "<mask>"]

F32 = npt.NDArray[np.float32]


def gemma_tokenizer(folder: Path, *, padding_side: str | None = None) -> Any:
    """A byte-fallback BPE in Gemma's shape (transformers' GemmaTokenizer: `<pad>` 0, `<eos>` 1, the 256 byte
    tokens), trained here, appending `<eos>` to every text, with fixed padding on the right to 64 written into its
    tokenizer.json, as SigLIP 2's fixed-resolution checkpoints ship theirs (transformers then pads on the right).
    `padding_side`: what its tokenizer_config.json says instead, if anything."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers
    from transformers import GemmaTokenizer

    trained = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    trained.normalizer = normalizers.Replace(" ", "▁")
    trained.pre_tokenizer = pre_tokenizers.Split(" ", "merged_with_previous")
    trainer = trainers.BpeTrainer(vocab_size=700, special_tokens=GEMMA_SPECIALS, show_progress=False)
    trained.train_from_iterator(make_sentences(300, seed=11), trainer)
    model = json.loads(trained.to_str())["model"]
    vocab: dict[str, int] = model["vocab"]
    for byte in range(256):
        vocab.setdefault(f"<0x{byte:02X}>", len(vocab))
    side = {} if padding_side is None else {"padding_side": padding_side}
    tokenizer = GemmaTokenizer(  # type: ignore[no-untyped-call]
        vocab=vocab, merges=[tuple(pair) for pair in model["merges"]], add_bos_token=False, add_eos_token=True,
        model_max_length=TEXT_LENGTH, **side,
    )  # fmt: skip
    tokenizer.backend_tokenizer.enable_padding(length=TEXT_LENGTH, pad_id=tokenizer.pad_token_id, pad_token="<pad>")
    tokenizer.save_pretrained(folder)
    return tokenizer


def text_config(tokenizer: Any) -> dict[str, Any]:
    return {
        "vocab_size": len(tokenizer), "max_position_embeddings": TEXT_LENGTH, "pad_token_id": tokenizer.pad_token_id,
        "eos_token_id": tokenizer.eos_token_id, "bos_token_id": None, **TINY,
    }  # fmt: skip


def build_siglip(folder: Path, *, padding_side: str | None = None, seed: int = 18) -> None:
    """A SigLIP as SigLIP 2's fixed-resolution checkpoints are saved: SiglipModel, SiglipImageProcessor
    (bicubic resize to 32x32, no crop, mean and std 0.5), a Gemma tokenizer."""
    from transformers import SiglipConfig, SiglipImageProcessorPil, SiglipModel

    tokenizer = gemma_tokenizer(folder, padding_side=padding_side)
    torch.manual_seed(seed)
    vision = {"image_size": IMAGE_SIZE, "patch_size": 8, **TINY}
    SiglipModel(SiglipConfig(text_config=text_config(tokenizer), vision_config=vision)).eval().save_pretrained(folder)
    SiglipImageProcessorPil(size={"height": IMAGE_SIZE, "width": IMAGE_SIZE}).save_pretrained(folder)


def build_siglip_left_padded(folder: Path) -> None:
    """The same, its tokenizer_config.json saying `padding_side: left` (as Gemma's tokenizers do): its texts are
    padded on the left, so the text tower's last position is the text's own last token."""
    build_siglip(folder, padding_side="left", seed=19)


def build_siglip_unmasked(folder: Path) -> None:
    """The same, its tokenizer_config.json's model_input_names without `attention_mask` (as SigLIP's processor
    returned its texts before transformers 5): the text tower is given no mask, so it attends to the padding."""
    build_siglip(folder, seed=22)
    path = folder / "tokenizer_config.json"
    config = json.loads(path.read_text())
    path.write_text(json.dumps({**config, "model_input_names": ["input_ids"]}, indent=2))


def build_siglip_sentencepiece(folder: Path) -> None:
    """SigLIP 1 as google's checkpoints ship it: SiglipModel and SiglipTokenizer's files (spiece.model, which
    only the sentencepiece package writes, is absent here: the folder is refused on the tokenizer class its
    tokenizer_config.json names, before any tokenizer file is read)."""
    from transformers import SiglipConfig, SiglipImageProcessorPil, SiglipModel

    torch.manual_seed(20)
    text = {
        "vocab_size": 32000, "max_position_embeddings": TEXT_LENGTH, "pad_token_id": 1, "eos_token_id": 1,
        "bos_token_id": None, **TINY,
    }  # fmt: skip
    vision = {"image_size": IMAGE_SIZE, "patch_size": 8, **TINY}
    SiglipModel(SiglipConfig(text_config=text, vision_config=vision)).eval().save_pretrained(folder)
    SiglipImageProcessorPil(size={"height": IMAGE_SIZE, "width": IMAGE_SIZE}).save_pretrained(folder)
    config = {
        "tokenizer_class": "SiglipTokenizer", "model_max_length": TEXT_LENGTH, "do_lower_case": True,
        "eos_token": "</s>", "pad_token": "</s>", "unk_token": "<unk>", "processor_class": "SiglipProcessor",
    }  # fmt: skip
    (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=2))


def build_siglip2_naflex(folder: Path) -> None:
    """SigLIP 2 NaFlex: Siglip2Model, Siglip2ImageProcessor (each image its own patch grid, up to 16 patches),
    a Gemma tokenizer."""
    from transformers import Siglip2Config, Siglip2ImageProcessorPil, Siglip2Model

    tokenizer = gemma_tokenizer(folder)
    torch.manual_seed(21)
    vision = {"patch_size": 8, "num_patches": 16, **TINY}
    Siglip2Model(Siglip2Config(text_config=text_config(tokenizer), vision_config=vision)).eval().save_pretrained(folder)
    Siglip2ImageProcessorPil(patch_size=8, max_num_patches=16).save_pretrained(folder)  # type: ignore[arg-type]


class ImageTextReference:
    """The folder through transformers as its model card runs it: AutoProcessor (texts padded to the maximum
    length, cut there when asked; images through its image processor), then the model's get_text_features and
    get_image_features. Rows are raw (the server's `normalize: false`) unless `normalized`."""

    def __init__(self, folder: Path):
        from transformers import AutoModel, AutoProcessor

        self.model = AutoModel.from_pretrained(folder).eval()
        self.processor = AutoProcessor.from_pretrained(folder)

    def texts(self, texts: list[str], *, normalized: bool = False) -> F32:
        inputs = self.processor(
            text=texts, padding="max_length", max_length=TEXT_LENGTH, truncation=True, return_tensors="pt"
        )
        with torch.inference_mode():
            rows = self.model.get_text_features(**inputs).pooler_output
        return self._rows(rows, normalized)

    def images(self, images: list[Any], *, normalized: bool = False) -> F32:
        inputs = self.processor(images=images, return_tensors="pt")
        with torch.inference_mode():
            rows = self.model.get_image_features(**inputs).pooler_output
        return self._rows(rows, normalized)

    @staticmethod
    def _rows(rows: torch.Tensor, normalized: bool) -> F32:
        if normalized:
            rows = torch.nn.functional.normalize(rows, dim=-1)
        return rows.numpy()  # type: ignore[no-any-return]


class ClipReference:
    """A CLIPModel folder through transformers: its processor, its towers, normalized like the server's output."""

    def __init__(self, folder: Path):
        from transformers import AutoImageProcessor, AutoTokenizer, CLIPModel

        self.model = CLIPModel.from_pretrained(folder).eval()
        self.tokenizer = AutoTokenizer.from_pretrained(folder)
        self.processor = AutoImageProcessor.from_pretrained(folder, backend="pil")

    def images(self, images: list[Any]) -> F32:
        with torch.inference_mode():
            pixel_values = torch.from_numpy(self.processor(images=images, return_tensors="np")["pixel_values"])
            features = self.model.get_image_features(pixel_values=pixel_values).pooler_output
            return torch.nn.functional.normalize(features, dim=-1).numpy()  # type: ignore[no-any-return]

    def texts(self, texts: list[str]) -> F32:
        with torch.inference_mode():
            rows = []
            for text in texts:
                encoded = self.tokenizer(text, return_tensors="pt")
                rows.append(self.model.get_text_features(**encoded).pooler_output[0])
            return torch.nn.functional.normalize(torch.stack(rows), dim=-1).numpy()  # type: ignore[no-any-return]
