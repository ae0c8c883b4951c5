"""The engine's half of image preprocessing: uint8 pixels from the API servers to normalized model input."""

from __future__ import annotations

import torch

from poolserve.model_card import ImageProcessing


def value_table(spec: ImageProcessing, device: torch.device) -> torch.Tensor:
    """(3, 256) float32: what each uint8 value of each channel becomes, by transformers' arithmetic.

    transformers' PIL processors rescale in float64 and round to float32 (`image.astype(np.float64) *
    scale`, then `.astype(np.float32)`), then normalize in float32. A float32 multiply differs from that
    by an ulp now and then, which normalization can magnify past 1e-6; 768 values are cheap to compute
    the exact way.
    """
    values = torch.arange(256, dtype=torch.float64)
    if spec.do_rescale:
        values = values * spec.rescale_factor
    table = values.to(torch.float32).expand(3, 256)
    if spec.do_normalize:
        mean = torch.tensor(spec.image_mean, dtype=torch.float32).view(3, 1)
        std = torch.tensor(spec.image_std, dtype=torch.float32).view(3, 1)
        table = (table - mean) / std
    return table.to(device)


def normalize_pixels(pixels: torch.Tensor, spec: ImageProcessing, dtype: torch.dtype) -> torch.Tensor:
    """(n, H, W, 3) uint8 on any device to (n, 3, H, W) `dtype` on the same device.

    Rescaled by `spec.rescale_factor` and normalized by `spec.image_mean` / `spec.image_std` as the spec
    says, computed in float32 and cast at the end: a uint8 input has 256 values per channel, so this is a
    table lookup, equal to transformers to the bit.
    """
    if pixels.dtype != torch.uint8 or pixels.dim() != 4 or pixels.shape[-1] != 3:
        raise ValueError(f"expected uint8 pixels of shape (n, H, W, 3), got {pixels.dtype} {tuple(pixels.shape)}")
    table = value_table(spec, pixels.device).to(dtype)
    n, height, width, _ = pixels.shape
    out = torch.empty((n, 3, height, width), dtype=dtype, device=pixels.device)
    for channel in range(3):
        # One channel at a time keeps the index tensor int32 and a third of the batch: uint8 would index
        # as a mask, and int64 indices for a whole batch of images cost 8 bytes per pixel value.
        out[:, channel] = table[channel][pixels[..., channel].to(torch.int32)]
    return out
