from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from transformers import CLIPConfig, SiglipConfig

from engine_core.folder_choices import LoadError, TextPadding, image_text_padding, model_kind, vision_tokens
from engine_core.st_modules import StFolder
from poolserve.model_card import CLIP

VISION = {"image_size": 32, "patch_size": 8}


def test_an_image_costs_its_patches_and_clips_class_token() -> None:
    assert vision_tokens(CLIPConfig(vision_config=VISION)) == 17
    assert vision_tokens(SiglipConfig(vision_config=VISION)) == 16


def tokenizer(max_length: int, side: str = "right", inputs: tuple[str, ...] = ("input_ids", "attention_mask")) -> Any:
    return SimpleNamespace(model_max_length=max_length, padding_side=side, model_input_names=list(inputs))


def test_siglip_texts_are_padded_to_the_tokenizers_maximum_within_the_text_towers_positions() -> None:
    siglip = SiglipConfig(text_config={"max_position_embeddings": 64}, vision_config=VISION)
    assert image_text_padding(siglip, tokenizer(64)) == TextPadding(64, left=False, masked=True)
    # Gemma's tokenizers state no maximum; a tokenizer returning no attention mask has the padding attended.
    assert image_text_padding(siglip, tokenizer(10**30, "left", ("input_ids",))) == TextPadding(64, True, False)
    assert image_text_padding(siglip, tokenizer(16)).width == 16
    # CLIP reads its end-of-text token wherever it is: its texts are padded to the batch's longest only.
    assert image_text_padding(CLIPConfig(vision_config=VISION), tokenizer(77)) == TextPadding()


def test_a_siglip_is_served_as_clip_unless_its_vision_tower_has_no_pooling_head() -> None:
    assert model_kind(SiglipConfig(vision_config=VISION), StFolder()) == CLIP
    headless = SiglipConfig(vision_config={**VISION, "vision_use_head": False})
    with pytest.raises(LoadError, match=r"vision_use_head is false"):
        model_kind(headless, StFolder())
