from __future__ import annotations

import io
import struct
import time
import zipfile
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image
from transformers import CLIPImageProcessorPil, SiglipImageProcessorPil

from apiserver.errors import ApiError
from apiserver.images.decode import (
    MAX_ASPECT_RATIO,
    MAX_RESIZED_PIXELS,
    decode_image,
    load_image_pixels,
    preprocess_image,
    resized_size,
)
from engine_core.image_config import read_image_processing
from engine_core.pixels import normalize_pixels
from poolserve.model_card import ImageProcessing

MAX_PIXELS = 1_000_000

# name -> the processor saved with save_pretrained and used as the reference.
PROCESSORS: dict[str, Any] = {
    "clip": CLIPImageProcessorPil(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32}),
    # The crop is wider than the resize, so every image narrower than 3:2 is padded.
    "wide_crop": CLIPImageProcessorPil(
        size={"shortest_edge": 24}, crop_size={"height": 20, "width": 36}, resample=Image.Resampling.BILINEAR
    ),
    "siglip": SiglipImageProcessorPil(size={"height": 24, "width": 40}),
}

# (1, 200) and (200, 1): the most elongated images taken (MAX_ASPECT_RATIO).
SIZES = [(30, 50), (61, 23), (40, 40), (1, 1), (3, 7), (17, 33), (300, 257), (10, 12), (1, 200), (200, 1)]

# (mode, format): the modes each format can hold, transparency included.
CASES = [
    ("RGB", "PNG"),
    ("RGBA", "PNG"),
    ("LA", "PNG"),
    ("L", "PNG"),
    ("P+transparency", "PNG"),
    ("RGB+tRNS", "PNG"),
    ("I;16", "PNG"),
    ("RGB", "JPEG"),
    ("L", "JPEG"),
    ("CMYK", "JPEG"),
    ("RGB", "WEBP"),
    ("RGBA", "WEBP"),
    ("P+transparency", "GIF"),
    ("L", "GIF"),
]


def make_image(mode: str, height: int, width: int, seed: int = 0) -> Image.Image:
    """Noise (the hardest input for a resampler) with alpha that is fully clear, opaque and in between."""
    rng = np.random.default_rng(seed)
    rgba = rng.integers(0, 256, (height, width, 4), dtype=np.uint8)
    rgba[..., 3] = rng.choice(np.array([0, 255, 128, 37], dtype=np.uint8), (height, width))
    image = Image.fromarray(rgba)
    if mode == "P+transparency":
        paletted = image.convert("RGB").quantize(16)
        paletted.info["transparency"] = 0
        return paletted
    if mode == "RGB+tRNS":
        rgb = image.convert("RGB")
        rgb.info["transparency"] = tuple(int(v) for v in rgba[0, 0, :3])
        return rgb
    if mode == "I;16":
        return Image.fromarray(rng.integers(0, 65536, (height, width), dtype=np.uint16))
    return image.convert(mode)


def encode(image: Image.Image, format: str) -> bytes:
    out = io.BytesIO()
    options: dict[str, Any] = {}
    if "transparency" in image.info:
        options["transparency"] = image.info["transparency"]
    if format == "WEBP":
        options["lossless"] = True
    image.save(out, format=format, **options)
    return out.getvalue()


@pytest.fixture(scope="module")
def specs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, ImageProcessing]:
    """Each processor saved to a folder and read back the way the engine reads it."""
    result = {}
    for name, processor in PROCESSORS.items():
        folder = tmp_path_factory.mktemp(name)
        processor.save_pretrained(folder)
        spec = read_image_processing(folder)
        assert spec is not None
        result[name] = spec
    return result


def expected_pixels(processor: Any, image: Image.Image) -> np.ndarray:
    return np.asarray(processor(images=image, return_tensors="np")["pixel_values"])


def our_pixels(data: bytes, spec: ImageProcessing) -> np.ndarray:
    pixels = load_image_pixels(data, spec, max_pixels=MAX_PIXELS, param="input[0]")
    return normalize_pixels(torch.from_numpy(pixels[None]), spec, torch.float32).numpy()


@pytest.mark.parametrize("name", list(PROCESSORS))
@pytest.mark.parametrize(("mode", "format"), CASES, ids=[f"{m}-{f}" for m, f in CASES])
@pytest.mark.parametrize("size", SIZES, ids=[f"{h}x{w}" for h, w in SIZES])
def test_pixels_equal_transformers_processor(
    specs: dict[str, ImageProcessing], name: str, mode: str, format: str, size: tuple[int, int]
) -> None:
    data = encode(make_image(mode, *size), format)
    spec = specs[name]
    decoded = decode_image(data, max_pixels=MAX_PIXELS, param="input[0]")
    expected = expected_pixels(PROCESSORS[name], decoded)
    ours = our_pixels(data, spec)
    assert ours.shape == expected.shape == (1, 3, *spec.output_size)
    np.testing.assert_allclose(ours, expected, rtol=0, atol=1e-6)


def test_the_cases_cover_every_mode_they_name() -> None:
    modes = {
        decode_image(encode(make_image(mode, 5, 6), format), max_pixels=MAX_PIXELS, param="x").mode
        for mode, format in CASES
    }
    assert {"RGB", "RGBA", "LA", "L", "P", "CMYK", "I;16"} <= modes


def test_an_animated_gif_gives_its_first_frame(specs: dict[str, ImageProcessing]) -> None:
    frames = [Image.new("RGB", (40, 40), color) for color in ((255, 0, 0), (0, 0, 255))]
    out = io.BytesIO()
    frames[0].save(out, format="GIF", save_all=True, append_images=frames[1:], duration=100, loop=0)
    pixels = load_image_pixels(out.getvalue(), specs["clip"], max_pixels=MAX_PIXELS, param="input[0]")
    assert (pixels[..., 0] > 200).all() and (pixels[..., 2] < 50).all()


def test_exif_orientation_is_applied_like_transformers_load_image() -> None:
    image = Image.new("RGB", (40, 20), (0, 0, 0))
    exif = Image.Exif()
    exif[0x0112] = 6  # stored sideways: turn 90 degrees clockwise to view
    out = io.BytesIO()
    image.save(out, format="JPEG", exif=exif)
    decoded = decode_image(out.getvalue(), max_pixels=MAX_PIXELS, param="input[0]")
    assert decoded.size == (20, 40)


def test_long_side_is_truncated_not_rounded() -> None:
    spec = ImageProcessing(resize_shortest_edge=32, crop_height=32, crop_width=32)
    assert resized_size(3, 7, spec) == (32, 74)  # 32 * 7 / 3 = 74.67
    assert resized_size(7, 3, spec) == (74, 32)
    assert resized_size(5, 5, spec) == (32, 32)


def test_a_small_image_is_padded_black_with_the_odd_pixel_on_top_and_left() -> None:
    spec = ImageProcessing(do_resize=False, crop_height=4, crop_width=4)
    pixels = preprocess_image(Image.new("RGB", (1, 1), (255, 255, 255)), spec)
    assert pixels.shape == (4, 4, 3)
    assert pixels[2, 2].tolist() == [255, 255, 255]
    assert int(pixels.sum()) == 3 * 255


def test_transparency_is_composited_onto_white() -> None:
    spec = ImageProcessing(do_resize=False, crop_height=2, crop_width=2)
    pixels = preprocess_image(Image.new("RGBA", (2, 2), (0, 0, 0, 0)), spec)
    assert (pixels == 255).all()


def png_claiming(width: int, height: int) -> bytes:
    """A well-formed PNG header and a few bytes of pixel data, whatever size it claims."""

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(b"\0" * 64)) + chunk(b"IEND", b"")
    )


def jpeg_bytes() -> bytes:
    return encode(make_image("RGB", 64, 64), "JPEG")


def zip_bytes() -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as archive:
        archive.writestr("cat.png", encode(make_image("RGB", 8, 8), "PNG"))
    return out.getvalue()


def ppm_bytes() -> bytes:
    return encode(make_image("RGB", 8, 8), "PPM")


HOSTILE = {
    "empty": (b"", "empty"),
    "random bytes": (np.random.default_rng(1).integers(0, 256, 4096, dtype=np.uint8).tobytes(), "format"),
    "a zip renamed .png": (zip_bytes(), "format"),
    "a format outside the whitelist": (ppm_bytes(), "format"),
    "a truncated jpeg": (jpeg_bytes()[: len(jpeg_bytes()) // 2], "truncated"),
    "a truncated png": (encode(make_image("RGB", 64, 64), "PNG")[:300], "truncated"),
    "a header claiming 100000x100000": (png_claiming(100_000, 100_000), "limit is"),
    "an image over max_pixels": (encode(make_image("RGB", 1001, 1000), "PNG"), "limit is"),
    "a header claiming zero width": (png_claiming(0, 10), ""),
}


@pytest.mark.parametrize(("data", "says"), list(HOSTILE.values()), ids=list(HOSTILE))
def test_hostile_input_is_a_400_naming_the_param(specs: dict[str, ImageProcessing], data: bytes, says: str) -> None:
    with pytest.raises(ApiError) as caught:
        load_image_pixels(data, specs["clip"], max_pixels=MAX_PIXELS, param="input[3]")
    assert caught.value.status == 400
    assert caught.value.param == "input[3]"
    assert "input[3]" in caught.value.message
    assert says in caught.value.message


def test_a_huge_declared_size_is_refused_before_any_allocation(specs: dict[str, ImageProcessing]) -> None:
    data = png_claiming(100_000, 100_000)
    started = time.perf_counter()
    with pytest.raises(ApiError, match="10000000000 pixels"):
        load_image_pixels(data, specs["clip"], max_pixels=40_000_000, param="input[0]")
    assert time.perf_counter() - started < 0.2


def test_images_past_pillows_own_bomb_limit_decode_when_within_ours(tmp_path: Path) -> None:
    # 90M one-bit pixels: past pillow's default 89.5M, whose warning pytest turns into an error here.
    # Mode 1 keeps the decoded image at 90 MB and the file at a few kB.
    width, height = 10_000, 9_000
    assert width * height > 89_478_485
    path = tmp_path / "big.png"
    Image.new("1", (width, height)).save(path)
    image = decode_image(path.read_bytes(), max_pixels=100_000_000, param="input[0]")
    assert image.size == (width, height)


def thin_png(width: int, height: int) -> bytes:
    """A real PNG of one gray value: a few hundred bytes whatever its size."""
    return encode(Image.new("L", (width, height), 128), "PNG")


@pytest.mark.parametrize(
    ("width", "height", "ratio"),
    [(1, 5000, "5000"), (5000, 1, "5000"), (1, 100_000, "100000"), (100_000, 1, "100000"), (2, 401, "200.5")],
)
def test_images_more_elongated_than_the_bound_are_refused(
    specs: dict[str, ImageProcessing], width: int, height: int, ratio: str
) -> None:
    # At a real CLIP's shortest edge of 224, 1x5000 would resize to 224x1120000 (750 MB of RGB).
    for spec in (specs["clip"], specs["siglip"]):
        with pytest.raises(ApiError) as caught:
            load_image_pixels(thin_png(width, height), spec, max_pixels=40_000_000, param="input[1]")
        assert caught.value.status == 400 and caught.value.param == "input[1]"
        assert caught.value.message == (
            f"input[1] is {width}x{height}, an aspect ratio of {ratio}:1; "
            f"this server takes images up to {MAX_ASPECT_RATIO}:1."
        )


def test_the_bounds_are_checked_on_the_header_before_any_pixel_is_decoded(specs: dict[str, ImageProcessing]) -> None:
    # The PNG claims 40,000,000x1 (within max_pixels) and holds 64 bytes of pixel data: decoding it would
    # fail as truncated, so the aspect-ratio message shows the check came first. Resized at a shortest edge
    # of 224 it would be 224x8960000000, which pillow cannot even represent (OverflowError).
    started = time.perf_counter()
    with pytest.raises(ApiError, match=r"40000000x1, an aspect ratio of 40000000:1"):
        load_image_pixels(png_claiming(40_000_000, 1), specs["clip"], max_pixels=40_000_000, param="input[0]")
    assert time.perf_counter() - started < 0.2


def test_the_resized_size_is_bounded_for_models_with_a_large_shortest_edge() -> None:
    spec = ImageProcessing(resize_shortest_edge=400, crop_height=400, crop_width=400)
    # 150:1 is within the ratio, but resized to a shortest edge of 400 it would be 400x60000 = 24M pixels.
    with pytest.raises(ApiError) as caught:
        load_image_pixels(thin_png(150, 1), spec, max_pixels=40_000_000, param="input[0]")
    assert caught.value.status == 400
    assert caught.value.message == (
        f"input[0] is 150x1; the model's resize would make it 60000x400 = 24000000 pixels; "
        f"the limit is {MAX_RESIZED_PIXELS}."
    )
    # 100:1 resizes to 40000x400 = 16M pixels, within the bound.
    assert load_image_pixels(thin_png(100, 1), spec, max_pixels=40_000_000, param="input[0]").shape == (400, 400, 3)


def test_a_fixed_size_resize_has_no_resized_bound_but_the_ratio_still_holds(specs: dict[str, ImageProcessing]) -> None:
    # SigLIP resizes to 24x40 whatever comes in: a big image within the ratio is fine.
    pixels = load_image_pixels(thin_png(4000, 20), specs["siglip"], max_pixels=40_000_000, param="input[0]")
    assert pixels.shape == (24, 40, 3)
