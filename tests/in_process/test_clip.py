"""A CLIP-style model served for real (the API server and engine of `launch`: stack_server.py): texts and images embed
into one space, equal to transformers' own. The API server's memory with thin images:
tests/e2e/test_several_models.py."""

from __future__ import annotations

import io
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import torch
from PIL import Image
from transformers import AutoTokenizer

from tests.conftest import CLIP_MAX_IMAGE_BYTES
from tests.fidelity.image_text_layouts import ClipReference as Direct
from tests.images import bomb_png, data_url, encode, make_image
from tests.in_process.stack_server import InProcessServer, served_folder

IMAGES = [make_image(64, 48, 1), make_image(30, 90, 2), make_image(32, 32, 3, "L"), make_image(17, 5, 4, "RGBA")]
TEXTS = ["a photo of a cat", "a diagram of a transformer", "red"]


class ImageHandler(BaseHTTPRequestHandler):
    """A loopback image host: /good.png, /missing, /slow, /big."""

    good = encode(IMAGES[0])

    def do_GET(self) -> None:
        if self.path == "/good.png":
            self._send(200, self.good)
        elif self.path == "/slow":
            time.sleep(3)
            self._send(200, self.good)
        elif self.path == "/big":
            self._send(200, b"\x89PNG" + b"\0" * (CLIP_MAX_IMAGE_BYTES * 2))
        else:
            self._send(404, b"no")

    def _send(self, status: int, body: bytes) -> None:
        self.send_response(status)
        self.send_header("content-type", "image/png")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def image_host() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), ImageHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture(scope="module")
def local_image(media_dir: Path) -> Path:
    path = media_dir / "local.png"
    path.write_bytes(encode(IMAGES[1]))
    return path


@pytest.fixture
def clip(clip_server: InProcessServer) -> Iterator[httpx.Client]:
    with clip_server.client() as client:
        yield client


@pytest.fixture(scope="module")
def direct(clip_model: Path) -> Direct:
    return Direct(clip_model)


def embed(client: httpx.Client, body: dict[str, Any], path: str = "/v1/embeddings") -> np.ndarray:
    response = client.post(path, json=body)
    assert response.status_code == 200, response.text
    key = "embedding" if path == "/v1/embeddings" else "data"
    return np.asarray([item[key] for item in response.json()["data"]], dtype=np.float32)


def test_image_embeddings_equal_transformers(clip: httpx.Client, direct: Direct) -> None:
    got = embed(clip, {"input": [{"image": data_url(encode(image))} for image in IMAGES]})
    np.testing.assert_allclose(got, direct.images(IMAGES), atol=1e-5)
    jpeg = encode(IMAGES[0], "JPEG")
    got_jpeg = embed(clip, {"input": [{"image": data_url(jpeg, "image/jpeg")}]})
    np.testing.assert_allclose(got_jpeg, direct.images([Image.open(io.BytesIO(jpeg))]), atol=1e-5)


def test_text_embeddings_equal_transformers(clip: httpx.Client, direct: Direct) -> None:
    np.testing.assert_allclose(embed(clip, {"input": TEXTS}), direct.texts(TEXTS), atol=1e-5)


def test_texts_and_images_in_one_request_keep_their_order(clip: httpx.Client, direct: Direct) -> None:
    body = {
        "input": [TEXTS[0], {"image": data_url(encode(IMAGES[0]))}, TEXTS[1], {"image": data_url(encode(IMAGES[1]))}]
    }
    got = embed(clip, body)
    texts, images = direct.texts(TEXTS[:2]), direct.images(IMAGES[:2])
    np.testing.assert_allclose(got, np.stack([texts[0], images[0], texts[1], images[1]]), atol=1e-5)
    pooled = embed(clip, body, "/pooling")
    np.testing.assert_allclose(pooled, got, atol=1e-6)


def test_chat_style_messages_with_an_image(clip: httpx.Client, direct: Direct) -> None:
    url = data_url(encode(IMAGES[2]))
    body = {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}}]}]}
    np.testing.assert_allclose(embed(clip, body), direct.images(IMAGES[2:3]), atol=1e-5)
    np.testing.assert_allclose(embed(clip, body, "/pooling"), direct.images(IMAGES[2:3]), atol=1e-5)
    text = {"messages": [{"role": "user", "content": [{"type": "text", "text": TEXTS[0]}]}]}
    np.testing.assert_allclose(embed(clip, text), direct.texts(TEXTS[:1]), atol=1e-5)


def test_images_fetched_over_http_and_from_the_allowed_folder(
    clip: httpx.Client, direct: Direct, image_host: str, local_image: Path
) -> None:
    fetched = embed(clip, {"input": [{"image": f"{image_host}/good.png"}]})
    np.testing.assert_allclose(fetched, direct.images(IMAGES[:1]), atol=1e-5)
    local = embed(clip, {"input": [{"image": str(local_image)}]})
    np.testing.assert_allclose(local, direct.images(IMAGES[1:2]), atol=1e-5)
    as_url = embed(clip, {"input": [{"image": f"file://{local_image}"}]})
    np.testing.assert_allclose(as_url, local, atol=1e-6)


@pytest.mark.parametrize(
    ("source", "status"),
    [
        (data_url(b"definitely not an image"), 400),
        (data_url(b"PK\x03\x04" + b"\0" * 100), 400),
        (data_url(encode(IMAGES[0], "JPEG")[:200], "image/jpeg"), 400),
        (data_url(bomb_png(100_000, 100_000)), 400),
        (data_url(encode(make_image(300, 300, 9))), 413),
        ("data:image/png;base64,@@@not-base64@@@", 400),
        ("ftp://example.com/cat.png", 400),
        ("/etc/passwd", 400),
        ("relative/path.png", 400),
    ],
)
def test_bad_images_are_refused_and_the_server_keeps_serving(clip: httpx.Client, source: str, status: int) -> None:
    started = time.perf_counter()
    response = clip.post("/v1/embeddings", json={"input": [{"image": source}]})
    assert response.status_code == status, response.text
    assert response.json()["error"]["param"] == "input[0].image"
    assert time.perf_counter() - started < 2
    assert clip.post("/v1/embeddings", json={"input": "still serving"}).status_code == 200


@pytest.mark.parametrize(("path", "status"), [("/missing", 400), ("/slow", 400), ("/big", 413)])
def test_fetch_failures_are_client_errors(clip: httpx.Client, image_host: str, path: str, status: int) -> None:
    started = time.perf_counter()
    response = clip.post("/v1/embeddings", json={"input": [{"image": f"{image_host}{path}"}]})
    assert response.status_code == status, response.text
    assert time.perf_counter() - started < 2.5  # --image-fetch-timeout 1


def test_clip_scores_texts_by_cosine(clip: httpx.Client, direct: Direct) -> None:
    response = clip.post("/score", json={"text_1": TEXTS[0], "text_2": TEXTS[1:]})
    assert response.status_code == 200, response.text
    vectors = direct.texts(TEXTS)
    np.testing.assert_allclose([d["score"] for d in response.json()["data"]], vectors[1:] @ vectors[0], atol=1e-5)


def test_decoder_embedder_uses_last_token_pooling(decoder_model: Path) -> None:
    from transformers import AutoModel

    texts = ["hello world", "a much longer sentence about embeddings and servers", "x"]
    tokenizer = AutoTokenizer.from_pretrained(decoder_model)
    model = AutoModel.from_pretrained(decoder_model).eval()
    with torch.inference_mode():
        rows = [model(**tokenizer(text, return_tensors="pt")).last_hidden_state[0, -1] for text in texts]
    expected = torch.nn.functional.normalize(torch.stack(rows), dim=-1).numpy()
    with served_folder(decoder_model) as server, server.client() as client:
        np.testing.assert_allclose(embed(client, {"input": texts}), expected, atol=1e-5)
        assert client.get("/info").json()["model_type"] == {"embedding": {"pooling": "last_token"}}
