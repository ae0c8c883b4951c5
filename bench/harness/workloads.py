"""The bench workloads: which model, which endpoint, and the request bodies, all built from a seed.

(a) short: one 10-40-word sentence per request, bundled MiniLM.
(b) batch16: 16 such sentences per request.
(c) image: one 640x480 JPEG per request (base64 data URL) on the tiny CLIP model.
(d) long: one ~512-token text per request on the tiny 512-position BERT.
rerank8: a query and 8 documents per /v1/rerank request (a bi-encoder embeds the 9 texts).
version: GET /version, the cheapest route of the server itself (a frontend floor).
trivial: GET / against bench.trivial_server (the generator's ceiling).
"""

from __future__ import annotations

import base64
import io
import random
from collections.abc import Callable
from dataclasses import dataclass

import msgspec

from bench.harness.corpus import make_long_text, make_sentences

CORPUS_SIZE = 2048
IMAGE_COUNT = 16
LONG_TEXT_COUNT = 64
LONG_TEXT_TOKENS = 512


@dataclass(frozen=True, slots=True)
class Workload:
    name: str
    letter: str
    model: str  # a bench.harness.models kind
    method: str
    path: str
    bodies: list[bytes]
    items_per_request: int
    description: str


def embeddings_body(inputs: object, model_name: str, encoding_format: str) -> bytes:
    body: dict[str, object] = {"input": inputs, "encoding_format": encoding_format}
    if model_name:
        body["model"] = model_name
    return msgspec.json.encode(body)


def corpus_sentences(seed: int) -> list[str]:
    """The sentences of workloads (a) and (b), shared with bench.offline."""
    return make_sentences(CORPUS_SIZE, seed)


def corpus_jpegs(seed: int) -> list[bytes]:
    """The JPEGs of workload (c), shared with bench.offline."""
    return make_jpegs(IMAGE_COUNT, seed)


def corpus_long_texts(seed: int) -> list[str]:
    """The texts of workload (d), shared with bench.offline."""
    return make_long_texts(LONG_TEXT_COUNT, seed)


def build_short(seed: int, model_name: str, encoding_format: str) -> Workload:
    sentences = corpus_sentences(seed)
    bodies = [embeddings_body([s], model_name, encoding_format) for s in sentences]
    return Workload("short", "a", "bundled", "POST", "/v1/embeddings", bodies, 1, "1 sentence/request, MiniLM")


def build_batch16(seed: int, model_name: str, encoding_format: str) -> Workload:
    sentences = corpus_sentences(seed)
    bodies = [embeddings_body(sentences[i : i + 16], model_name, encoding_format) for i in range(0, len(sentences), 16)]
    return Workload("batch16", "b", "bundled", "POST", "/v1/embeddings", bodies, 16, "16 sentences/request, MiniLM")


def build_image(seed: int, model_name: str, encoding_format: str) -> Workload:
    urls = ["data:image/jpeg;base64," + base64.b64encode(jpeg).decode() for jpeg in corpus_jpegs(seed)]
    bodies = [embeddings_body([{"image": url}], model_name, encoding_format) for url in urls]
    return Workload("image", "c", "clip", "POST", "/v1/embeddings", bodies, 1, "1 640x480 JPEG/request, tiny CLIP")


def build_long(seed: int, model_name: str, encoding_format: str) -> Workload:
    bodies = [embeddings_body([text], model_name, encoding_format) for text in corpus_long_texts(seed)]
    return Workload("long", "d", "tiny512", "POST", "/v1/embeddings", bodies, 1, "1 512-token text/request, tiny BERT")


def build_rerank8(seed: int, model_name: str, encoding_format: str) -> Workload:
    sentences = corpus_sentences(seed)
    bodies = [
        msgspec.json.encode({"query": sentences[i], "documents": sentences[i + 1 : i + 9], "return_documents": False,
                             **({"model": model_name} if model_name else {})})
        for i in range(0, len(sentences) - 9, 9)
    ]  # fmt: skip
    return Workload("rerank8", "-", "bundled", "POST", "/v1/rerank", bodies, 8, "a query and 8 documents/request")


def build_version(seed: int, model_name: str, encoding_format: str) -> Workload:
    return Workload("version", "-", "bundled", "GET", "/version", [b""], 0, "GET /version")


def build_trivial(seed: int, model_name: str, encoding_format: str) -> Workload:
    return Workload("trivial", "-", "", "GET", "/", [b""], 0, "GET / on bench.trivial_server")


BUILDERS: dict[str, Callable[[int, str, str], Workload]] = {
    "short": build_short,
    "batch16": build_batch16,
    "image": build_image,
    "long": build_long,
    "rerank8": build_rerank8,
    "version": build_version,
    "trivial": build_trivial,
}
# Which bench.harness.models kind each workload runs on, known without building its bodies.
MODELS = {
    "short": "bundled", "batch16": "bundled", "image": "clip", "long": "tiny512", "rerank8": "bundled",
    "version": "bundled",
}  # fmt: skip
LETTERS = {"a": "short", "b": "batch16", "c": "image", "d": "long"}
WORKLOAD_NAMES = tuple(BUILDERS)


def resolve_name(name: str) -> str:
    """A workload's name from its name or its issue letter (a-d)."""
    resolved = LETTERS.get(name, name)
    if resolved not in BUILDERS:
        raise ValueError(f"unknown workload {name!r}; use one of {', '.join([*LETTERS, *BUILDERS])}")
    return resolved


def build_workload(name: str, *, seed: int = 0, model_name: str = "", encoding_format: str = "float") -> Workload:
    return BUILDERS[resolve_name(name)](seed, model_name, encoding_format)


def make_jpegs(count: int, seed: int, size: tuple[int, int] = (640, 480), quality: int = 85) -> list[bytes]:
    """Photo-like 640x480 JPEGs: smooth gradients, shapes and grain, so they compress like photos
    (tens of KB) rather than like noise (hundreds) or flat colour (a few)."""
    import numpy as np
    from PIL import Image, ImageDraw

    rng = np.random.default_rng(seed)
    width, height = size
    jpegs = []
    for _ in range(count):
        y, x = np.mgrid[0:height, 0:width].astype(np.float32)
        channels = [
            127 + 100 * np.sin(x / rng.uniform(40, 200) + rng.uniform(0, 6)) * np.cos(y / rng.uniform(40, 200))
            for _ in range(3)
        ]
        pixels = np.stack(channels, axis=-1) + rng.normal(0, 6, (height, width, 3))
        image = Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8), "RGB")
        draw = ImageDraw.Draw(image)
        for _ in range(12):
            x0, y0 = int(rng.integers(0, width - 40)), int(rng.integers(0, height - 40))
            box = (x0, y0, x0 + int(rng.integers(20, 200)), y0 + int(rng.integers(20, 150)))
            fill = tuple(int(v) for v in rng.integers(0, 256, 3))
            (draw.ellipse if rng.random() < 0.5 else draw.rectangle)(box, fill=fill)
        out = io.BytesIO()
        image.save(out, "JPEG", quality=quality)
        jpegs.append(out.getvalue())
    return jpegs


def make_long_texts(count: int, seed: int, tokens: int = LONG_TEXT_TOKENS) -> list[str]:
    """Texts that tokenize to just under `tokens` with the bundled BERT tokenizer (special tokens
    included), so every request is near the model's full length and none needs truncation."""
    from tokenizers import Tokenizer

    from bench.harness.models import bundled_model_folder

    tokenizer = Tokenizer.from_file(str(bundled_model_folder() / "tokenizer.json"))
    tokenizer.no_truncation()
    tokenizer.no_padding()
    rng = random.Random(seed)
    texts = []
    for _ in range(count):
        words = make_long_text(rng, tokens).split()
        # Words are mostly one token each; cut by the ratio, then shave to fit exactly.
        while len(tokenizer.encode(" ".join(words)).ids) > tokens:
            excess = len(tokenizer.encode(" ".join(words)).ids) - tokens
            words = words[: len(words) - max(1, excess // 2)]
        texts.append(" ".join(words))
    return texts
