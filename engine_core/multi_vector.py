"""A late-interaction (ColBERT) model's token vectors: queries expanded, documents' skiplist left out.

sentence-transformers' MultiVectorEncoder runs Transformer -> token-level heads (Dense, ...) ->
MultiVectorMask -> Normalize; this runs the same on a batch. A query is padded with the expansion token up
to the expansion length (the model attends to those places only when its config says so, but every one of
them is scored); a document keeps the vectors of its tokens outside the skiplist. The normalization is the
per-request step every per-token row gets (engine_core/postprocess.py).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from transformers import PretrainedConfig, PreTrainedTokenizerBase

from engine_core.folder_choices import LoadError
from engine_core.runner import F32, Rows, to_device, to_numpy
from engine_core.st_folder import LateInteractionFolder
from poolserve.protocol import TASK_POOL, TASK_SCORE, TASK_TOKEN_EMBED, TASK_TOKENIZE, LateInteraction, Task


class MultiVectorRunner:
    """An encoder whose every token's state goes through the model's heads; each input answers its token vectors."""

    def __init__(
        self,
        model: torch.nn.Module,
        *,
        spec: LateInteraction,
        pad_token_id: int,
        device: torch.device,
        heads: torch.nn.Module | None = None,
    ):
        self.model = model
        self.spec = spec
        self.heads = heads
        self.pad_token_id = pad_token_id
        self.device = device

    def run_token_vectors(self, rows: Rows, type_rows: Rows | None, is_query: Sequence[bool]) -> list[F32]:
        """Each input's token vectors (`LateInteraction.vector_count` x the heads' width), from one padded pass."""
        spec = self.spec
        count = len(rows)
        widths = [
            max(len(row), spec.expansion) if query else len(row) for row, query in zip(rows, is_query, strict=True)
        ]
        width = max(widths)
        input_ids = np.full((count, width), self.pad_token_id, dtype=np.int64)
        attention = np.zeros((count, width), dtype=np.int64)
        scored = np.zeros((count, width), dtype=bool)
        token_types = None if type_rows is None else np.zeros((count, width), dtype=np.int64)
        skiplist = np.asarray(spec.skiplist_ids, dtype=np.int64)
        for i, row in enumerate(rows):
            length = len(row)
            input_ids[i, :length] = row
            if token_types is not None and type_rows is not None:
                token_types[i, :length] = type_rows[i]
            if is_query[i]:
                # ColBERT's query expansion: the places after the text hold the expansion token, all scored.
                input_ids[i, length : widths[i]] = spec.expansion_token_id
                attention[i, : widths[i] if spec.attend_expansion else length] = 1
                scored[i, : widths[i]] = True
            else:
                attention[i, :length] = 1
                scored[i, :length] = ~np.isin(row, skiplist) if skiplist.size else True
        inputs = {"input_ids": to_device(input_ids, self.device), "attention_mask": to_device(attention, self.device)}
        if token_types is not None:
            inputs["token_type_ids"] = to_device(token_types, self.device)
        with torch.inference_mode():
            hidden = self.model(**inputs).last_hidden_state.float()
            vectors = hidden if self.heads is None else self.heads(hidden)
            states = to_numpy(vectors)
        return [states[i][scored[i]] for i in range(count)]

    def run_texts(self, rows: Rows, type_rows: Rows | None) -> F32:
        """One row per input (its first token vector, as a document): only the loader's warm-up and timing ask."""
        return np.stack([vectors[0] for vectors in self.run_token_vectors(rows, type_rows, [False] * len(rows))])

    def run_texts_per_token(self, rows: Rows, type_rows: Rows | None, per_token: Sequence[bool]) -> list[F32]:
        return self.run_token_vectors(rows, type_rows, [False] * len(rows))

    def run_images(self, pixels: np.ndarray) -> F32:
        raise TypeError("this model takes no images")


# What a late-interaction model serves: token vectors (/pooling's token_embed, /embed_all), MaxSim scores.
LATE_INTERACTION_TASKS: list[Task] = [TASK_TOKEN_EMBED, TASK_POOL, TASK_SCORE, TASK_TOKENIZE]


def refuse_original_colbert(model_config: PretrainedConfig) -> None:
    """Stanford's ColBERT folders (HF_ColBERT) keep their projection beside the encoder's weights, where
    AutoModel would drop it and answer the encoder's states as if they were the model's vectors."""
    if "HF_ColBERT" in (model_config.architectures or []):
        raise LoadError(
            "the original ColBERT layout (HF_ColBERT: its projection among the encoder's weights, its markers in "
            "artifact.metadata) is not served yet; re-save it with sentence-transformers 6's MultiVectorEncoder."
        )


def late_interaction_spec(
    late: LateInteractionFolder, tokenizer: PreTrainedTokenizerBase, max_model_len: int, positions: int | None
) -> LateInteraction:
    """The card's LateInteraction: the folder's lengths (each within the model's positions), its expansion token
    and its skiplist as token ids, resolved as sentence-transformers resolves them with the same tokenizer."""
    for name, length in (("query_length", late.query_length), ("document_length", late.document_length),
                         ("query_expansion length", late.expansion)):  # fmt: skip
        if positions and length > positions:
            raise LoadError(f"the MultiVectorEncoder's {name} {length} exceeds the model's {positions} positions.")
    if late.expansion_token is not None:
        token_id = tokenizer.convert_tokens_to_ids(late.expansion_token)
        if not isinstance(token_id, int) or token_id == tokenizer.unk_token_id:
            raise LoadError(f"the query_expansion token {late.expansion_token!r} is not in the model's vocabulary.")
    else:
        # sentence-transformers' fallback, PyLate's: [MASK] for an encoder, else the end-of-sequence token.
        token_id = tokenizer.mask_token_id if tokenizer.mask_token_id is not None else tokenizer.eos_token_id
    if late.expansion and token_id is None:
        raise LoadError("the MultiVectorEncoder expands queries but its tokenizer has no mask or end token.")
    skiplist: list[int] = []
    for word in late.skiplist_words:
        # A word that is not one token would skip every [UNK] instead: sentence-transformers drops it (and warns).
        word_id = tokenizer.convert_tokens_to_ids(word)
        if isinstance(word_id, int) and (word_id != tokenizer.unk_token_id or word == tokenizer.unk_token):
            skiplist.append(word_id)
    # A fixed expansion cuts queries at its length; a floor ("min") leaves query_length (or the maximum) the cut.
    query_length = late.expansion if late.expansion and late.expansion_is_fixed else late.query_length
    if late.expansion and not late.expansion_is_fixed and late.query_length:
        query_length = max(late.query_length, late.expansion)
    return LateInteraction(
        query_length=query_length or max_model_len,
        document_length=late.document_length or max_model_len,
        expansion=late.expansion,
        attend_expansion=late.attend_expansion,
        expansion_token_id=int(token_id or 0),
        skiplist_ids=sorted(set(skiplist)),
        similarity="meanmaxsim" if late.similarity == "meanmaxsim" else "maxsim",
    )
