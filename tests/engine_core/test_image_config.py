from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from transformers import CLIPImageProcessorPil, ConvNextImageProcessorPil, SiglipImageProcessorPil

from engine_core.image_config import ImageConfigError, read_image_processing
from poolserve.model_card import ImageProcessing

CLIP_MEAN = [0.48145466, 0.4578275, 0.40821073]
CLIP_STD = [0.26862954, 0.26130258, 0.27577711]


def saved(folder: Path, processor: Any) -> Path:
    processor.save_pretrained(folder)
    return folder


def test_a_folder_without_preprocessor_config_has_no_image_processing(tmp_path: Path) -> None:
    assert read_image_processing(tmp_path) is None


def test_a_clip_processor_maps_to_shortest_edge_and_crop(tmp_path: Path) -> None:
    folder = saved(tmp_path, CLIPImageProcessorPil(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32}))
    assert read_image_processing(folder) == ImageProcessing(
        do_convert_rgb=True,
        do_resize=True,
        resize_shortest_edge=32,
        resample=3,
        do_center_crop=True,
        crop_height=32,
        crop_width=32,
        do_rescale=True,
        rescale_factor=1 / 255,
        do_normalize=True,
        image_mean=CLIP_MEAN,
        image_std=CLIP_STD,
    )


def test_a_siglip_processor_maps_to_an_exact_resize_without_crop(tmp_path: Path) -> None:
    folder = saved(tmp_path, SiglipImageProcessorPil(size={"height": 24, "width": 40}))
    spec = read_image_processing(folder)
    assert spec == ImageProcessing(
        do_convert_rgb=True,
        do_resize=True,
        resize_height=24,
        resize_width=40,
        resample=3,
        do_center_crop=False,
        do_rescale=True,
        rescale_factor=1 / 255,
        do_normalize=True,
        image_mean=[0.5, 0.5, 0.5],
        image_std=[0.5, 0.5, 0.5],
    )
    assert spec.output_size == (24, 40)


def test_a_config_written_by_hand_in_the_old_style_is_read(tmp_path: Path) -> None:
    # The shape of openai/clip-vit-base-patch32's file: int sizes, the feature-extractor era's keys.
    (tmp_path / "preprocessor_config.json").write_text(
        json.dumps(
            {
                "crop_size": 224,
                "do_center_crop": True,
                "do_normalize": True,
                "do_resize": True,
                "feature_extractor_type": "CLIPFeatureExtractor",
                "image_mean": CLIP_MEAN,
                "image_std": CLIP_STD,
                "resample": 3,
                "size": 224,
            }
        )
    )
    spec = read_image_processing(tmp_path)
    assert spec is not None
    assert (spec.resize_shortest_edge, spec.crop_height, spec.crop_width) == (224, 224, 224)
    assert spec.output_size == (224, 224)


def test_no_resize_with_a_crop_is_fine(tmp_path: Path) -> None:
    folder = saved(tmp_path, CLIPImageProcessorPil(do_resize=False, crop_size={"height": 8, "width": 12}))
    spec = read_image_processing(folder)
    assert spec is not None
    assert not spec.do_resize
    assert spec.output_size == (8, 12)


def test_one_number_for_mean_and_std_counts_for_every_channel(tmp_path: Path) -> None:
    folder = saved(tmp_path, SiglipImageProcessorPil(size={"height": 8, "width": 8}, image_mean=0.25, image_std=2.0))
    spec = read_image_processing(folder)
    assert spec is not None
    assert (spec.image_mean, spec.image_std) == ([0.25] * 3, [2.0] * 3)


@pytest.mark.parametrize(
    ("processor", "says"),
    [
        (CLIPImageProcessorPil(size={"shortest_edge": 32}, do_center_crop=False), "shortest edge"),
        (CLIPImageProcessorPil(do_resize=False, do_center_crop=False), "neither resizes nor center crops"),
        (
            CLIPImageProcessorPil(size={"shortest_edge": 32, "longest_edge": 64}, crop_size=32),
            "supports shortest_edge or height and width",
        ),
        (SiglipImageProcessorPil(size={"height": 8, "width": 8}, do_pad=True, pad_size=16), "do_pad"),
        (SiglipImageProcessorPil(size={"height": 8, "width": 8}, image_mean=[0.5, 0.5]), "one value per RGB channel"),
        (ConvNextImageProcessorPil(), "its own way"),
    ],
    ids=["shortest edge without crop", "no resize no crop", "longest edge", "pad", "two means", "convnext"],
)
def test_unsupported_processors_raise_one_clear_sentence(tmp_path: Path, processor: Any, says: str) -> None:
    folder = saved(tmp_path, processor)
    with pytest.raises(ImageConfigError, match=says):
        read_image_processing(folder)


def test_a_broken_config_file_is_an_image_config_error(tmp_path: Path) -> None:
    (tmp_path / "preprocessor_config.json").write_text("{not json")
    with pytest.raises(ImageConfigError, match=r"preprocessor_config\.json"):
        read_image_processing(tmp_path)
