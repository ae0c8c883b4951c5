"""A SigLIP served for real (the API server and engine of `launch`, in this process: stack_server.py): texts padded
to its 64 tokens and images resized without a crop, embedded as transformers' processor and get_text_features /
get_image_features embed them."""

from __future__ import annotations

import io
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from PIL import Image

from tests.fidelity.image_text_layouts import ImageTextReference, build_siglip
from tests.images import data_url, encode, make_image
from tests.in_process.stack_server import served_folder

IMAGES = [make_image(64, 48, 1), make_image(30, 90, 2), make_image(32, 32, 3, "L"), make_image(17, 5, 4, "RGBA")]
TEXTS = ["a photo of a cat", "A Diagram, of a TRANSFORMER!", "déjà vu 🐱", "x"]
LONG = " ".join(["servers"] * 100)


@pytest.fixture(scope="module")
def siglip_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("siglip")
    build_siglip(folder)
    return folder


@pytest.fixture(scope="module")
def siglip(siglip_folder: Path) -> Iterator[httpx.Client]:
    with served_folder(siglip_folder) as server, server.client() as client:
        yield client


@pytest.fixture(scope="module")
def reference(siglip_folder: Path) -> ImageTextReference:
    return ImageTextReference(siglip_folder)


def embed(client: httpx.Client, body: dict[str, Any]) -> np.ndarray:
    response = client.post("/v1/embeddings", json=body)
    assert response.status_code == 200, response.text
    return np.asarray([item["embedding"] for item in response.json()["data"]], dtype=np.float32)


def assert_same(served: np.ndarray, expected: np.ndarray) -> None:
    cosine = np.einsum("ij,ij->i", served, expected) / np.linalg.norm(served, axis=1) / np.linalg.norm(expected, axis=1)
    assert cosine.min() >= 0.9999, cosine
    np.testing.assert_allclose(served, expected, atol=1e-5, rtol=1e-4)


def test_text_embeddings_equal_get_text_features_on_max_length_padding(
    siglip: httpx.Client, reference: ImageTextReference
) -> None:
    assert_same(embed(siglip, {"input": TEXTS, "normalize": False}), reference.texts(TEXTS))
    assert_same(embed(siglip, {"input": TEXTS}), reference.texts(TEXTS, normalized=True))
    # One text at a time gives the same rows: every text is padded to 64 tokens, whatever its batch.
    alone = np.concatenate([embed(siglip, {"input": [text], "normalize": False}) for text in TEXTS])
    assert_same(alone, reference.texts(TEXTS))


def test_a_text_over_64_tokens_is_refused_unless_the_request_asks_to_cut_it(
    siglip: httpx.Client, reference: ImageTextReference
) -> None:
    response = siglip.post("/v1/embeddings", json={"input": [LONG]})
    assert response.status_code == 400, response.text
    assert response.json()["error"]["code"] == "context_length_exceeded"
    cut = embed(siglip, {"input": [LONG], "normalize": False, "truncate_prompt_tokens": -1})
    assert_same(cut, reference.texts([LONG]))  # the processor's truncation=True: 63 tokens and the end of text


def test_image_embeddings_equal_get_image_features(siglip: httpx.Client, reference: ImageTextReference) -> None:
    sources = [{"image": data_url(encode(image))} for image in IMAGES]
    assert_same(embed(siglip, {"input": sources, "normalize": False}), reference.images(IMAGES))
    jpeg = encode(IMAGES[0], "JPEG")
    got = embed(siglip, {"input": [{"image": data_url(jpeg, "image/jpeg")}]})
    assert_same(got, reference.images([Image.open(io.BytesIO(jpeg))], normalized=True))


def test_texts_and_images_in_one_request_keep_their_order(siglip: httpx.Client, reference: ImageTextReference) -> None:
    sources = [{"image": data_url(encode(image))} for image in IMAGES[:2]]
    got = embed(siglip, {"input": [TEXTS[0], sources[0], TEXTS[1], sources[1]]})
    texts, images = reference.texts(TEXTS[:2], normalized=True), reference.images(IMAGES[:2], normalized=True)
    assert_same(got, np.stack([texts[0], images[0], texts[1], images[1]]))


def test_score_compares_texts_by_cosine_as_for_clip(siglip: httpx.Client, reference: ImageTextReference) -> None:
    response = siglip.post("/score", json={"text_1": TEXTS[0], "text_2": TEXTS[1:]})
    assert response.status_code == 200, response.text
    vectors = reference.texts(TEXTS, normalized=True)
    np.testing.assert_allclose([d["score"] for d in response.json()["data"]], vectors[1:] @ vectors[0], atol=1e-5)


def test_usage_counts_the_texts_tokens_not_their_padding(siglip: httpx.Client, reference: ImageTextReference) -> None:
    response = siglip.post("/v1/embeddings", json={"input": TEXTS})
    assert response.status_code == 200, response.text
    tokens = sum(len(reference.processor.tokenizer(text)["input_ids"]) for text in TEXTS)
    assert response.json()["usage"]["prompt_tokens"] == tokens < 64 * len(TEXTS)
