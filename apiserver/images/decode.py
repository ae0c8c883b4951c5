"""Image decoding and the API server's half of image preprocessing: convert to RGB, resize, center crop.

The steps and their rounding copy transformers' PIL image processors (`PilBackend`: `convert_to_rgb`,
`get_resize_output_image_size`, `center_crop`), so that once the engine rescales and normalizes
(engine_core/pixels.py) the result equals what transformers gives for the same image.
"""

from __future__ import annotations

import functools
import io

import numpy as np
import numpy.typing as npt
from PIL import Image, ImageOps

from apiserver.errors import ApiError
from poolserve.model_card import ImageProcessing

# What a client may send. A whitelist, not "whatever pillow opens": pillow also parses EPS (through
# Ghostscript), FLI, PCX, SGI and dozens more formats nobody sends to an embedding server, and every
# decoder is attack surface. MPO is how pillow names the JPEGs many phone cameras write (with extra
# pictures attached).
FORMATS = ("PNG", "JPEG", "MPO", "WEBP", "GIF", "BMP", "TIFF", "AVIF")

# Pillow's own decompression-bomb guard is one process-wide number (89.5M pixels: it warns above, refuses
# above twice that) checked inside Image.open. Our limit is --max-image-pixels, checked right after
# Image.open has read the header and before any pixel is decoded, so pillow's guard adds nothing, and
# left on it would warn about, or refuse, images the operator allowed. This process owns pillow, so the
# guard is switched off here once, deliberately, rather than raised per call from worker threads.
Image.MAX_IMAGE_PIXELS = None

WHITE = (255, 255, 255, 255)

# How elongated an image may be, long side to short: Qwen2-VL's processors (in transformers and vLLM)
# refuse past 200:1 too. A shortest-edge resize scales the long side with the short one, so a 92-byte
# 1x5000 PNG becomes 224x1120000 pixels (750 MB of RGB) at CLIP's 224, and 1x100000 a MemoryError.
MAX_ASPECT_RATIO = 200
# What the resize may produce, in pixels (48 MiB as RGB): 200:1 at a shortest edge of 224 is 10M.
# It binds the models with a larger shortest edge, whose 200:1 images would still be too big.
MAX_RESIZED_PIXELS = 16_777_216


def decode_image(data: bytes, *, max_pixels: int, param: str) -> Image.Image:
    """The image in `data`, fully decoded, upright, its first frame if animated."""
    return decoded(open_image(data, max_pixels=max_pixels, param=param), param=param)


def open_image(data: bytes, *, max_pixels: int, param: str) -> Image.Image:
    """The image in `data` with its header read and no pixel decoded.

    The declared size is checked against `max_pixels` here, so a small file that claims a huge canvas
    is refused without the allocation.
    """
    if not data:
        raise ApiError(400, f"{param} is empty; expected an image.", param=param)
    try:
        image = Image.open(io.BytesIO(data), formats=accepted_formats())
    except Exception as exc:
        # Unknown formats raise UnidentifiedImageError, but malformed headers reach pillow's plugins,
        # which raise a zoo of types (SyntaxError, struct.error, EOFError, ValueError...): all mean the
        # same thing to the client.
        raise ApiError(
            400,
            f"{param} is not an image in a supported format ({', '.join(accepted_formats())}).",
            param=param,
        ) from exc
    width, height = image.size
    if width < 1 or height < 1:
        raise ApiError(400, f"{param} declares an empty image ({width}x{height}).", param=param)
    if width * height > max_pixels:
        raise ApiError(
            400,
            f"{param} is {width}x{height} = {width * height} pixels; the limit is {max_pixels}.",
            param=param,
        )
    return image


def check_shape(width: int, height: int, spec: ImageProcessing, *, param: str) -> None:
    """Refuse an image whose resize would cost far more memory than its pixels: too elongated, or too big
    once resized. Called on the header's size; the EXIF rotation that may follow swaps width and height,
    which changes neither the ratio nor the resized area."""
    short, long = sorted((width, height))
    if long > MAX_ASPECT_RATIO * short:
        ratio = f"{long / short:.1f}".rstrip("0").rstrip(".")
        raise ApiError(
            400,
            f"{param} is {width}x{height}, an aspect ratio of {ratio}:1; "
            f"this server takes images up to {MAX_ASPECT_RATIO}:1.",
            param=param,
        )
    if spec.do_resize:
        resized_height, resized_width = resized_size(height, width, spec)
        if resized_height * resized_width > MAX_RESIZED_PIXELS:
            raise ApiError(
                400,
                f"{param} is {width}x{height}; the model's resize would make it {resized_width}x{resized_height} "
                f"= {resized_width * resized_height} pixels; the limit is {MAX_RESIZED_PIXELS}.",
                param=param,
            )


def decoded(image: Image.Image, *, param: str) -> Image.Image:
    """`image` (opened by open_image) with its pixels decoded and turned upright.

    Truncated or corrupt files are errors, never padded.
    """
    try:
        image.load()
        # As transformers' load_image does: phone photos are stored sideways with an EXIF tag saying so.
        ImageOps.exif_transpose(image, in_place=True)
    except Exception as exc:
        raise ApiError(400, f"{param} could not be decoded: {exc}.", param=param) from exc
    return image


@functools.cache
def accepted_formats() -> tuple[str, ...]:
    """FORMATS less any this pillow lacks (AVIF came in pillow 11.2); Image.open fails on unknown names."""
    Image.init()
    return tuple(name for name in FORMATS if name in Image.OPEN)


def preprocess_image(image: Image.Image, spec: ImageProcessing) -> npt.NDArray[np.uint8]:
    """uint8 pixels of shape (*spec.output_size, 3): `image` converted to RGB, resized and center cropped."""
    image = to_rgb(image, composite_alpha=spec.do_convert_rgb)
    if spec.do_resize:
        height, width = resized_size(image.height, image.width, spec)
        image = image.resize((width, height), resample=Image.Resampling(spec.resample))
    if spec.do_center_crop:
        image = center_crop(image, spec.crop_height, spec.crop_width)
    # A copy, not a read-only view of pillow's buffer: callers hand it to numpy and torch as their own.
    return np.array(image, dtype=np.uint8)


def load_image_pixels(data: bytes, spec: ImageProcessing, *, max_pixels: int, param: str) -> npt.NDArray[np.uint8]:
    """Decode `data` and preprocess it for the model `spec` describes; client errors are ApiErrors.

    Every size check is made on the header, before a pixel is allocated.
    """
    image = open_image(data, max_pixels=max_pixels, param=param)
    check_shape(image.width, image.height, spec, param=param)
    image = decoded(image, param=param)
    try:
        return preprocess_image(image, spec)
    except (OSError, ValueError) as exc:
        # Pillow cannot convert a few exotic modes (a TIFF may hold nearly anything) to RGB.
        raise ApiError(400, f"{param} could not be converted to RGB: {exc}.", param=param) from exc


def to_rgb(image: Image.Image, *, composite_alpha: bool) -> Image.Image:
    """RGB as transformers' convert_to_rgb makes it: transparency is composited onto white.

    Its test for transparency is kept exactly, quirks included: an "A" band (so LAB counts, while
    premultiplied La and RGBa do not) or a `transparency` entry (palette and tRNS images).
    Without `composite_alpha` (do_convert_rgb false) transformers would keep the image's own
    channels, which for anything but RGB the model cannot take; pillow's plain conversion is used.
    """
    if composite_alpha and ("A" in image.getbands() or image.info.get("transparency") is not None):
        background = Image.new("RGBA", image.size, WHITE)
        return Image.alpha_composite(background, image.convert("RGBA")).convert("RGB")
    return image if image.mode == "RGB" else image.convert("RGB")


def resized_size(height: int, width: int, spec: ImageProcessing) -> tuple[int, int]:
    """(height, width) after the resize, by transformers' get_resize_output_image_size.

    The short side becomes `resize_shortest_edge`, the long side `int(size * long / short)`: float
    division, then truncation, not rounding (a 3x7 image at 32 becomes 32x74, not 32x75).
    Images already at the target size are still resampled, as transformers does.
    """
    size = spec.resize_shortest_edge
    if not size:
        return (spec.resize_height, spec.resize_width)
    short, long = (width, height) if width <= height else (height, width)
    new_long = int(size * long / short)
    return (new_long, size) if width <= height else (size, new_long)


def center_crop(image: Image.Image, crop_height: int, crop_width: int) -> Image.Image:
    """The centered crop_height x crop_width window, black where the image is smaller than the window.

    transformers' numpy center_crop puts the odd pixel of a crop on the bottom/right
    (`(size - crop) // 2`) and, when it pads, the odd pixel of padding on the top/left
    (`ceil((crop - size) / 2)`). Floor division of a negative difference gives exactly that
    padding, and pillow fills what lies outside the image with zeros, as transformers pads.
    """
    top = (image.height - crop_height) // 2
    left = (image.width - crop_width) // 2
    return image.crop((left, top, left + crop_width, top + crop_height))
