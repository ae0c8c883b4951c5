"""Model cards for tests that need one without a model: a BERT mean-pooling embedder, and a CLIP beside it."""

from __future__ import annotations

import msgspec

from poolserve.model_card import ImageProcessing, ModelCard

CARD = ModelCard(
    path="/models/m",
    architecture="BertModel",
    kind="embedding",
    tasks=["embed", "score", "pool", "tokenize"],
    max_model_len=256,
    output_size=384,
    vocab_size=30522,
    pooling="mean",
    normalize=True,
    pad_token_id=0,
    tokenizer_json="{}",
    device="cpu",
    dtype="float32",
)
CLIP_CARD = msgspec.structs.replace(
    CARD,
    kind="clip",
    pooling="projection",
    image=ImageProcessing(crop_height=4, crop_width=3),
    image_tokens=50,
)
