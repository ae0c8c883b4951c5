"""The fidelity suite's inputs, and how a served answer is held to its reference."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

F32 = npt.NDArray[np.float32]

TEXTS = ["Hello world!", "A MUCH longer sentence, about Servers and EMBEDDINGS.", "x", "déjà vu"]
QUERY = "where are the servers?"
DOCUMENTS = ["servers run in racks", "a cat sat on a mat", "Embeddings live in vector stores."]


def assert_same(served: F32, reference: F32) -> None:
    assert served.shape == reference.shape
    cosine = (
        np.einsum("ij,ij->i", served, reference) / np.linalg.norm(served, axis=1) / np.linalg.norm(reference, axis=1)
    )
    assert cosine.min() >= 0.9999, cosine
    np.testing.assert_allclose(served, reference, atol=1e-5, rtol=1e-4)
