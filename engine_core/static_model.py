"""sentence-transformers' StaticEmbedding (model2vec's static models): the mean of trained per-token vectors.

No transformer runs: a text's vector is an EmbeddingBag's mean over its token ids, tokenized without
special tokens, as StaticEmbedding.preprocess tokenizes. Thousands of texts a second on one core, so
the engine runs the whole batch's ids laid end to end (no padding: the runner packs), then the
folder's heads (Normalize, Dense) like any embedder's.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import numpy.typing as npt
import torch
from tokenizers import Tokenizer

from engine_core.st_heads import read_module_state
from engine_core.st_modules import MetadataError

F32 = npt.NDArray[np.float32]
Rows = Sequence[npt.NDArray[np.int32]]


def read_static_tokenizer(folder: Path) -> tuple[Tokenizer, int | None]:
    """The folder's tokenizer with no special tokens added, padding and truncation off, so that the API servers
    tokenize as StaticEmbedding does (`encode_batch(texts, add_special_tokens=False)`); and the length its
    tokenizer.json truncates to, which StaticEmbedding leaves on (None: it embeds any text whole)."""
    spec = json.loads((folder / "tokenizer.json").read_text(encoding="utf-8"))
    max_length = (spec.get("truncation") or {}).get("max_length")
    spec["post_processor"] = None
    spec["padding"] = None
    spec["truncation"] = None
    return Tokenizer.from_str(json.dumps(spec)), int(max_length) if max_length else None


def read_static_weights(folder: Path) -> torch.Tensor:
    """The per-token vectors: StaticEmbedding's `embedding.weight`, or model2vec's `embeddings` with its
    optional `mapping` and `weights` folded in as sentence-transformers folds them."""
    state = read_module_state(folder)
    if "embedding.weight" in state:
        return state["embedding.weight"].float()
    if "embeddings" not in state:
        raise MetadataError(f"the StaticEmbedding weights in {folder} hold neither embedding.weight nor embeddings")
    embeddings = state["embeddings"].float()
    if "mapping" in state:
        embeddings = embeddings[state["mapping"].long()]
    if "weights" in state:
        embeddings = embeddings * state["weights"].float()[:, None]
    return embeddings.contiguous()


class StaticRunner:
    """One EmbeddingBag pass over a batch's ids end to end, then the heads, in float32."""

    def __init__(self, weights: torch.Tensor, *, device: torch.device, heads: torch.nn.Module | None = None):
        self.embedding = torch.nn.EmbeddingBag.from_pretrained(weights, mode="mean").to(device).eval()
        self.device = device
        self.heads = heads

    def run_texts(self, rows: Rows, type_rows: Rows | None) -> F32:
        lengths = np.fromiter((len(row) for row in rows), dtype=np.int64, count=len(rows))
        offsets = np.zeros(len(rows), dtype=np.int64)
        np.cumsum(lengths[:-1], out=offsets[1:])
        ids = np.concatenate(rows).astype(np.int64) if len(rows) else np.zeros(0, dtype=np.int64)
        with torch.inference_mode():
            pooled = self.embedding(torch.from_numpy(ids).to(self.device), torch.from_numpy(offsets).to(self.device))
            if self.heads is not None:
                pooled = self.heads(pooled)
            vectors: F32 = pooled.float().cpu().numpy()
            return vectors

    def run_texts_per_token(
        self, rows: Rows, type_rows: Rows | None, per_token: Sequence[bool], pool_from: Sequence[int] | None = None
    ) -> list[F32]:
        raise TypeError("this model gives no token states")  # the engine refuses such requests first

    def run_images(self, pixels: npt.NDArray[np.uint8]) -> F32:
        raise TypeError("this model takes no images")
