"""A CLIP-style model's API server on real `launch` processes: thin and wide images cost that process no memory (its
own VmRSS and VmHWM, which the test's process, holding every model of the suite, cannot show). Everything else of the
CLIP model: tests/in_process/test_clip.py."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from PIL import Image

from bench.harness.server_process import PoolserveProcess
from tests.fidelity.image_text_layouts import ClipReference
from tests.images import data_url, encode, make_image
from tests.utils import api_server_pids

IMAGES = [make_image(64, 48, 1), make_image(30, 90, 2)]


@pytest.fixture
def clip(clip_server: PoolserveProcess) -> Iterator[httpx.Client]:
    with clip_server.client() as client:
        yield client


@pytest.fixture(scope="module")
def direct(clip_model: Path) -> ClipReference:
    return ClipReference(clip_model)


def embed(client: httpx.Client, body: dict[str, Any]) -> np.ndarray:
    response = client.post("/v1/embeddings", json=body)
    assert response.status_code == 200, response.text
    return np.asarray([item["embedding"] for item in response.json()["data"]], dtype=np.float32)


@pytest.fixture(scope="module")
def thin_pngs() -> dict[tuple[int, int], bytes]:
    """Real PNGs of one value each, made once: a few hundred bytes to a few kB, whatever their size.

    40,000,000x1 is within the default --max-image-pixels; mode "1" keeps it at 5 MB while it is made.
    """
    sizes = [(1, 5000), (1, 100_000), (100_000, 1)]
    pngs = {size: encode(Image.new("L", size, 200)) for size in sizes}
    pngs[(40_000_000, 1)] = encode(Image.new("1", (40_000_000, 1), 1))
    return pngs


def memory_kib(pid: int) -> dict[str, int]:
    """VmRSS (resident now) and VmHWM (the peak resident so far) of a process, in KiB."""
    fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line)
    return {name: int(fields[name].split()[0]) for name in ("VmRSS", "VmHWM")}


def test_thin_and_wide_images_are_refused_before_any_pixel_is_allocated(
    clip_server: PoolserveProcess, clip: httpx.Client, direct: ClipReference, thin_pngs: dict[tuple[int, int], bytes]
) -> None:
    # Resized to a shortest edge, a 1x5000 image grew a CLIP server by 1 GB, 1x100000 raised MemoryError and
    # 40,000,000x1 an OverflowError, both as plain-text 500s.
    (pid,) = api_server_pids(clip_server).values()
    assert embed(clip, {"input": [{"image": data_url(encode(IMAGES[0]))}]}).shape == (1, 16)
    before = memory_kib(pid)
    for (width, height), png in thin_pngs.items():
        assert len(png) < 10_000
        response = clip.post("/v1/embeddings", json={"input": [{"image": data_url(png)}]})
        assert response.status_code == 400, response.text
        error = response.json()["error"]
        assert error["type"] == "invalid_request_error" and error["param"] == "input[0].image"
        ratio = max(width, height) // min(width, height)
        assert error["message"] == (
            f"input[0].image is {width}x{height}, an aspect ratio of {ratio}:1; this server takes images up to 200:1."
        )
    after = memory_kib(pid)
    assert after["VmRSS"] - before["VmRSS"] < 100 * 1024, (before, after)
    assert after["VmHWM"] - before["VmHWM"] < 100 * 1024, (before, after)
    # The same server still embeds a normal image, and one at the bound, exactly.
    np.testing.assert_allclose(
        embed(clip, {"input": [{"image": data_url(encode(IMAGES[1]))}]}), direct.images(IMAGES[1:2]), atol=1e-5
    )
    at_bound = make_image(2, 400, 5)
    np.testing.assert_allclose(
        embed(clip, {"input": [{"image": data_url(encode(at_bound))}]}), direct.images([at_bound]), atol=1e-5
    )
