"""`--dtype int8`: the int8 layer itself, the bundled model served within the bound, and the refusals."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from engine_core import loader
from engine_core.cpu_precision import Agreement
from engine_core.folder_choices import LoadError
from engine_core.int8_linear import Int8Linear
from engine_core.load_model import load_model
from poolserve.config import Config
from tests.fidelity.stack import serve_in_process
from tests.sentences import SENTENCES


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.einsum("ij,ij->i", a, b) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)  # type: ignore[no-any-return]


def test_an_int8_layer_follows_its_float_layer_despite_an_outlier_input_channel() -> None:
    torch.manual_seed(0)
    linear = torch.nn.Linear(64, 32)
    inputs = torch.randn(40, 64)
    inputs[:, 5] *= 50  # one channel far larger than the rest, as a LayerNorm's output often has
    layer = Int8Linear(linear, inputs.abs().amax(0))
    with torch.no_grad():
        expected, got = linear(inputs).numpy(), layer(inputs.reshape(5, 8, 64)).reshape(40, 32).numpy()
    assert cosines(got, expected).min() > 0.999
    assert not np.array_equal(got, expected)


def test_int8_serves_the_bundled_model_within_cosine_0995_of_sentence_transformers(bundled_model: Path) -> None:
    from sentence_transformers import SentenceTransformer

    loaded = load_model(Config(device="cpu", dtype="int8"))
    assert loaded.card.dtype == "int8"
    assert loaded.packs_tokens  # int8 layers run inside the packed encoder
    with serve_in_process(loaded) as client:
        response = client.post("/v1/embeddings", json={"input": SENTENCES})
        assert response.status_code == 200, response.text
        served = np.asarray([item["embedding"] for item in response.json()["data"]], dtype=np.float32)
    reference = SentenceTransformer(str(bundled_model), device="cpu").encode(SENTENCES)
    agreement = cosines(served, reference)
    assert agreement.min() >= 0.995
    assert agreement.min() < 0.99999  # int8 indeed, not float32


def test_int8_is_refused_at_start_where_the_model_strays_on_the_probe_set(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(loader, "measure_agreement", lambda reference, candidate: Agreement(0.99, 1.0))
    with pytest.raises(LoadError, match=r"--dtype int8 is refused for this model: .*min cosine 0\.9900.*>= 0\.995"):
        load_model(Config(device="cpu", dtype="int8"))


def test_int8_is_refused_for_a_cross_encoder(cross_encoder_model: Path) -> None:
    with pytest.raises(LoadError, match="--dtype int8 serves single-vector embedding models; this is a classifier"):
        load_model(Config(model=str(cross_encoder_model), device="cpu", dtype="int8"))
