"""Run by PyLate's own interpreter (not poolserve's: PyLate 1.6 pins sentence-transformers 5.3 and transformers
<= 5.3): saves a ColBERT built by PyLate from a base model folder, and writes what PyLate computes with it.

    python tests/fidelity/pylate_reference.py BASE_FOLDER OUT_FOLDER REFERENCE.npz TEXTS.json

TEXTS.json holds {"texts": [...], "query": "...", "documents": [...]}. The .npz holds each text's token vectors
as a query (`query_i`) and as a document (`document_i`), and the query's MaxSim against each document (`scores`),
from PyLate's `encode(is_query=...)` and `colbert_scores`.
"""

from __future__ import annotations

import json
import sys

import numpy as np
import torch
from pylate import models, scores


def main() -> None:
    base, out, reference, texts_path = sys.argv[1:5]
    texts = json.loads(open(texts_path, encoding="utf-8").read())
    torch.manual_seed(7)
    model = models.ColBERT(
        model_name_or_path=base, embedding_size=16, query_length=12, document_length=40, device="cpu"
    )
    model.save(out)
    model = models.ColBERT(model_name_or_path=out, device="cpu")  # what a user loads
    arrays: dict[str, np.ndarray] = {}
    for role, is_query in (("query", True), ("document", False)):
        for i, vectors in enumerate(model.encode(texts["texts"], is_query=is_query)):
            arrays[f"{role}_{i}"] = np.asarray(vectors, dtype=np.float32)
    query = torch.tensor(np.stack(model.encode([texts["query"]], is_query=True)))
    documents = [torch.tensor(vectors) for vectors in model.encode(texts["documents"], is_query=False)]
    # One document at a time: no padding rows for the max to find.
    arrays["scores"] = np.asarray(
        [float(scores.colbert_scores(query, document[None])[0, 0]) for document in documents], dtype=np.float32
    )
    np.savez(reference, **arrays)


if __name__ == "__main__":
    main()
