"""Reads a model folder's image preprocessing with transformers and states it as an ImageProcessing."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from poolserve.model_card import ImageProcessing

# The steps of transformers' PilBackend that apiserver/images/decode.py and engine_core/pixels.py reproduce. A
# processor class that overrides any of them does something else (ConvNeXt's crop_pct resize, SigLIP 2's
# patches, EfficientNet's offset rescale), and serving it with our steps would quietly give other inputs.
PIPELINE_METHODS = (
    "preprocess",
    "_preprocess_image_like_inputs",
    "_prepare_image_like_inputs",
    "_standardize_kwargs",
    "process_image",
    "convert_to_rgb",
    "_preprocess",
    "resize",
    "center_crop",
    "rescale",
    "normalize",
)
# Pillow's Resampling values: NEAREST, LANCZOS, BILINEAR, BICUBIC, BOX, HAMMING.
RESAMPLING = range(6)


class ImageConfigError(ValueError):
    """The folder's image preprocessing is something poolserve cannot reproduce; one sentence says what."""


def read_image_processing(folder: Path) -> ImageProcessing | None:
    """The preprocessing `folder`'s preprocessor_config.json asks for; None when it has none."""
    if not (folder / "preprocessor_config.json").is_file():
        return None
    from transformers import AutoImageProcessor
    from transformers.image_processing_backends import PilBackend

    # The PIL backend, because the API servers resize with pillow: transformers' torchvision backend
    # resizes tensors and pads small images on the other side, so it is not the reference we match.
    try:
        # (transformers 5.25 types from_pretrained; earlier 5.x releases did not)
        processor = AutoImageProcessor.from_pretrained(folder, backend="pil")  # type: ignore[no-untyped-call, unused-ignore]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ImageConfigError(f"transformers cannot load {folder / 'preprocessor_config.json'}: {exc}") from exc
    name = type(processor).__name__
    if not isinstance(processor, PilBackend):
        raise ImageConfigError(f"{name} is not one of transformers' standard image processors.")
    overridden = [m for m in PIPELINE_METHODS if getattr(type(processor), m) is not getattr(PilBackend, m)]
    if overridden:
        raise ImageConfigError(
            f"{name} preprocesses images its own way ({', '.join(overridden)}); "
            "poolserve reproduces only the standard steps."
        )
    return image_processing_of(name, processor)


def image_processing_of(name: str, processor: Any) -> ImageProcessing:
    """Map a standard processor's attributes; unset booleans are off, as in transformers' `if do_x:`."""
    if processor.do_pad:
        raise ImageConfigError(f"{name} pads images after normalizing (do_pad), which poolserve does not support.")
    do_resize = bool(processor.do_resize)
    do_center_crop = bool(processor.do_center_crop)
    shortest_edge = height = width = 0
    if do_resize:
        size = dict(processor.size or {})
        if size.keys() == {"shortest_edge"}:
            shortest_edge = pixel_count(name, "size", size["shortest_edge"])
        elif size.keys() == {"height", "width"}:
            height, width = (
                pixel_count(name, "size", size["height"]),
                pixel_count(name, "size", size["width"]),
            )
        else:
            raise ImageConfigError(f"{name} resizes to {size}; poolserve supports shortest_edge or height and width.")
    crop_height = crop_width = 0
    if do_center_crop:
        crop = dict(processor.crop_size or {})
        if crop.keys() != {"height", "width"}:
            raise ImageConfigError(f"{name} center crops to {crop}; poolserve needs a height and a width.")
        crop_height = pixel_count(name, "crop_size", crop["height"])
        crop_width = pixel_count(name, "crop_size", crop["width"])
    elif shortest_edge:
        # Batching needs one input size for every image of the model.
        raise ImageConfigError(
            f"{name} resizes the shortest edge to {shortest_edge} without a center crop, so each aspect "
            "ratio gives another input size; poolserve needs one size for all images."
        )
    elif not do_resize:
        raise ImageConfigError(
            f"{name} neither resizes nor center crops, so every image keeps its own size; "
            "poolserve needs one size for all images."
        )
    # transformers resamples with BILINEAR when none is set.
    resample = processor.resample if processor.resample is not None else 2
    if not isinstance(resample, int) or resample not in RESAMPLING:
        raise ImageConfigError(f"{name} resamples with {processor.resample!r}, which is not a pillow filter.")
    do_rescale = bool(processor.do_rescale)
    rescale_factor = 1 / 255 if processor.rescale_factor is None else float(processor.rescale_factor)
    if do_rescale and processor.rescale_factor is None:
        raise ImageConfigError(f"{name} rescales pixel values (do_rescale) but gives no rescale_factor.")
    do_normalize = bool(processor.do_normalize)
    return ImageProcessing(
        do_convert_rgb=bool(processor.do_convert_rgb),
        do_resize=do_resize,
        resize_shortest_edge=shortest_edge,
        resize_height=height,
        resize_width=width,
        resample=int(resample),
        do_center_crop=do_center_crop,
        crop_height=crop_height,
        crop_width=crop_width,
        do_rescale=do_rescale,
        rescale_factor=rescale_factor,
        do_normalize=do_normalize,
        image_mean=channel_values(name, "image_mean", processor.image_mean) if do_normalize else [0.0] * 3,
        image_std=channel_values(name, "image_std", processor.image_std) if do_normalize else [1.0] * 3,
    )


def pixel_count(name: str, field: str, value: object) -> int:
    if not isinstance(value, int) or value < 1:
        raise ImageConfigError(f"{name} has {value!r} in {field}; sizes must be whole numbers of pixels, 1 or more.")
    return value


def channel_values(name: str, field: str, value: float | Sequence[float] | None) -> list[float]:
    """Three floats, one per RGB channel; a single number counts for all three, as transformers has it."""
    if isinstance(value, int | float):
        return [float(value)] * 3
    if value is None or len(value) != 3:
        raise ImageConfigError(f"{name} has {field} {value!r}; poolserve needs one value per RGB channel.")
    return [float(v) for v in value]
