"""Images from their sources to uint8 pixels: data: URLs inline, http(s) URLs and local files fetched first."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from apiserver.images.decode import load_image_pixels
from apiserver.images.media import MediaFetcher
from poolserve.model_card import ImageProcessing

# An image as the engine takes it: height x width x 3, uint8.
Pixels = npt.NDArray[np.uint8]


@dataclass(frozen=True, slots=True)
class ImageSource:
    """Where an image comes from (a data: URL, an http(s) URL, a local file) and the field that named it."""

    source: str
    param: str


class ImageLoader:
    def __init__(self, media: MediaFetcher, spec: ImageProcessing | None, max_pixels: int):
        self.media = media
        self.spec = spec
        self.max_pixels = max_pixels

    def is_remote(self, source: str) -> bool:
        """Whether getting the bytes means waiting on I/O (fetched on the event loop first)."""
        return source[:5].lower() != "data:"

    async def fetch_all(self, sources: list[ImageSource]) -> dict[str, bytes]:
        distinct = {source.source: source for source in sources}
        fetched = await asyncio.gather(*(self.media.fetch(s.source, param=s.param) for s in distinct.values()))
        return dict(zip(distinct, fetched, strict=True))

    def load(self, source: ImageSource, fetched: Mapping[str, bytes] | None = None) -> Pixels:
        """Decode and preprocess one image; runs on the preprocessing pool."""
        assert self.spec is not None
        if fetched is not None and source.source in fetched:
            data = fetched[source.source]
        else:
            data = self.media.decode_data_url(source.source, source.param)
        return load_image_pixels(data, self.spec, max_pixels=self.max_pixels, param=source.param)
