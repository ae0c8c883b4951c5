from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers.image_transforms import normalize, rescale
from transformers.image_utils import ChannelDimension

from engine_core.pixels import normalize_pixels
from poolserve.model_card import ImageProcessing

CLIP = ImageProcessing(
    resize_shortest_edge=224,
    crop_height=224,
    crop_width=224,
    image_mean=[0.48145466, 0.4578275, 0.40821073],
    image_std=[0.26862954, 0.26130258, 0.27577711],
)
SPECS = {
    "clip": CLIP,
    # A factor and statistics where a float32 multiply is off by an ulp, magnified past 1e-6.
    "odd_factor": ImageProcessing(
        resize_height=8,
        resize_width=8,
        do_center_crop=False,
        rescale_factor=0.3,
        image_mean=[0.1, 7.0, 0.5],
        image_std=[0.01, 3.0, 0.27],
    ),
    "no_rescale": ImageProcessing(
        resize_height=8,
        resize_width=8,
        do_center_crop=False,
        do_rescale=False,
        image_mean=[100.0, 2.0, 0.0],
        image_std=[50.0, 1.0, 3.0],
    ),
    "no_normalize": ImageProcessing(resize_height=8, resize_width=8, do_center_crop=False, do_normalize=False),
    "neither": ImageProcessing(
        resize_height=8, resize_width=8, do_center_crop=False, do_rescale=False, do_normalize=False
    ),
}


def every_value_batch() -> np.ndarray:
    """(2, 16, 24, 3) uint8 in which every channel takes every one of the 256 values."""
    values = np.arange(256, dtype=np.uint8).reshape(16, 16)
    image = np.stack([values, values[::-1], values.T], axis=-1)
    batch = np.stack([np.pad(image, ((0, 0), (0, 8), (0, 0))), np.roll(np.pad(image, ((0, 0), (8, 0), (0, 0))), 1)])
    return np.ascontiguousarray(batch)


def transformers_values(pixels: np.ndarray, spec: ImageProcessing) -> np.ndarray:
    """What transformers' PIL backend does after the crop, image by image, channels first."""
    out = []
    for image in pixels:
        chw: np.ndarray = np.moveaxis(image, -1, 0)
        if spec.do_rescale:
            chw = rescale(chw, spec.rescale_factor, input_data_format=ChannelDimension.FIRST)
        if spec.do_normalize:
            chw = normalize(chw, spec.image_mean, spec.image_std, input_data_format=ChannelDimension.FIRST)
        out.append(chw.astype(np.float32))
    return np.stack(out)


@pytest.mark.parametrize("name", list(SPECS))
def test_values_equal_transformers_to_the_bit(name: str) -> None:
    spec = SPECS[name]
    pixels = every_value_batch()
    ours = normalize_pixels(torch.from_numpy(pixels), spec, torch.float32)
    assert ours.shape == (2, 3, 16, 24)
    assert ours.dtype == torch.float32
    assert ours.is_contiguous()
    np.testing.assert_array_equal(ours.numpy(), transformers_values(pixels, spec))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_is_the_float32_result_cast_once(dtype: torch.dtype) -> None:
    pixels = torch.from_numpy(every_value_batch())
    full = normalize_pixels(pixels, CLIP, torch.float32)
    half = normalize_pixels(pixels, CLIP, dtype)
    assert half.dtype == dtype
    assert torch.equal(half, full.to(dtype))


def test_channels_stay_apart() -> None:
    pixels = torch.zeros((1, 2, 2, 3), dtype=torch.uint8)
    pixels[..., 1] = 255
    out = normalize_pixels(pixels, SPECS["no_normalize"], torch.float32)
    assert out[:, 0].eq(0).all() and out[:, 1].eq(1).all() and out[:, 2].eq(0).all()


def test_a_non_contiguous_batch_gives_the_same_values() -> None:
    pixels = torch.from_numpy(every_value_batch())
    strided = pixels.transpose(1, 2)
    assert not strided.is_contiguous()
    assert torch.equal(
        normalize_pixels(strided, CLIP, torch.float32), normalize_pixels(strided.contiguous(), CLIP, torch.float32)
    )


@pytest.mark.parametrize(
    "pixels",
    [
        torch.zeros((1, 4, 4, 3), dtype=torch.float32),
        torch.zeros((4, 4, 3), dtype=torch.uint8),
        torch.zeros((1, 3, 4, 4), dtype=torch.uint8),
    ],
    ids=["float", "no batch axis", "channels first"],
)
def test_anything_but_uint8_nhwc_is_refused(pixels: torch.Tensor) -> None:
    with pytest.raises(ValueError, match="uint8"):
        normalize_pixels(pixels, CLIP, torch.float32)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_values_on_cuda_equal_those_on_cpu() -> None:
    pixels = torch.from_numpy(every_value_batch())
    on_gpu = normalize_pixels(pixels.cuda(), CLIP, torch.float32)
    assert on_gpu.device.type == "cuda"
    assert torch.equal(on_gpu.cpu(), normalize_pixels(pixels, CLIP, torch.float32))
