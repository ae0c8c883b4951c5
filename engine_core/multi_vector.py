"""A late-interaction (ColBERT) model's token vectors: queries expanded, documents' skiplist left out.

sentence-transformers' MultiVectorEncoder runs Transformer -> token-level heads (Dense, ...) ->
MultiVectorMask -> Normalize; this runs the same on a batch. A query is padded with the expansion token up
to the expansion length (the model attends to those places only when its config says so, but every one of
them is scored); a document keeps the vectors of its tokens outside the skiplist. The normalization is the
per-request step every per-token row gets (engine_core/postprocess.py).
"""

from __future__ import annotations

import json
import string
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from transformers import AddedToken, PretrainedConfig, PreTrainedTokenizerBase

from engine_core.folder_choices import LoadError
from engine_core.runner import F32, Rows, to_device, to_numpy
from engine_core.st_heads import Dense, read_module_state
from engine_core.st_modules import DenseHead, LateInteractionFolder, StFolder
from poolserve.model_card import TASK_POOL, TASK_SCORE, TASK_TOKEN_EMBED, TASK_TOKENIZE, LateInteraction, Task


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
            # Only the scored places leave the device, input after input.
            kept = to_numpy(vectors[to_device(scored, self.device)])
        return np.split(kept, np.cumsum(scored.sum(axis=1))[:-1])

    def run_texts(self, rows: Rows, type_rows: Rows | None) -> F32:
        """One row per input (its first token vector, as a document): only the loader's warm-up and timing ask."""
        return np.stack([vectors[0] for vectors in self.run_token_vectors(rows, type_rows, [False] * len(rows))])

    def run_texts_per_token(
        self, rows: Rows, type_rows: Rows | None, per_token: Sequence[bool], pool_from: Sequence[int] | None = None
    ) -> list[F32]:
        return self.run_token_vectors(rows, type_rows, [False] * len(rows))

    def run_images(self, pixels: np.ndarray) -> F32:
        raise TypeError("this model takes no images")


# What a late-interaction model serves: token vectors (/pooling's token_embed, /embed_all), MaxSim scores.
LATE_INTERACTION_TASKS: list[Task] = [TASK_TOKEN_EMBED, TASK_POOL, TASK_SCORE, TASK_TOKENIZE]


# Stanford's ColBERT (colbert-ai's HF_ColBERT) as sentence-transformers' MultiVectorEncoder loads it: its markers
# and lengths from artifact.metadata, with these defaults where the file is absent or silent.
STANFORD_MARKERS = {"query": "[unused0]", "document": "[unused1]"}
STANFORD_QUERY_LENGTH = 32


def is_stanford_colbert(model_config: PretrainedConfig, st: StFolder) -> bool:
    return not st.has_modules and "HF_ColBERT" in (model_config.architectures or [])


def read_stanford_colbert(folder: Path) -> StFolder:
    """An HF_ColBERT folder as sentence-transformers reads it: prompts are its markers followed by a space, queries
    expanded to query_maxlen unattended (attend_to_mask_tokens), documents cut at doc_maxlen and left without
    punctuation (mask_punctuation, on unless the metadata turns it off); the projection is `linear.weight` among
    the encoder's weights (stanford_projection), the vectors normalized."""
    path = folder / "artifact.metadata"
    try:
        metadata: dict[str, Any] = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    except (OSError, ValueError) as exc:
        raise LoadError(f"cannot read {path}: {exc}") from exc
    markers = {
        "query": str(metadata.get("query_token_id") or STANFORD_MARKERS["query"]),
        "document": str(metadata.get("doc_token_id") or STANFORD_MARKERS["document"]),
    }
    late = LateInteractionFolder(
        document_length=int(metadata.get("doc_maxlen") or 0),
        expansion=int(metadata.get("query_maxlen") or STANFORD_QUERY_LENGTH),
        attend_expansion=bool(metadata.get("attend_to_mask_tokens")),
        skiplist_words=tuple(string.punctuation) if metadata.get("mask_punctuation", True) else (),
    )
    prompts = {role: marker + " " for role, marker in markers.items()}
    return StFolder(prompts=prompts, normalize=True, late_interaction=late, legacy_prefixes=tuple(prompts.values()))


def register_prefix_tokens(tokenizer: PreTrainedTokenizerBase, prefixes: Sequence[str]) -> None:
    """sentence-transformers' `_register_prefix_tokens` for a legacy checkpoint's markers: a marker the vocabulary
    knows but the tokenizer splits (`[unused0]` -> `[`, `unused`, `##0`, `]`) becomes a special token of its own,
    not normalized, as ColBERT inserted it when it trained. The API servers then tokenize with it too (the card's
    tokenizer.json)."""
    added = set(getattr(tokenizer, "added_tokens_encoder", None) or {})
    vocab = tokenizer.get_vocab()
    register: list[AddedToken] = []
    for value in prefixes:
        if not value or not value.split():
            continue
        for prefix in (value, value.split(None, 1)[0]):
            if prefix not in added and prefix not in vocab:
                continue
            if tokenizer.tokenize(prefix) != [prefix]:
                register.append(AddedToken(prefix, normalized=False, special=True))
            break
    if register:
        tokenizer.add_special_tokens({"additional_special_tokens": register})


def stanford_projection(folder: Path, hidden_size: int, device: torch.device) -> torch.nn.Module:
    """HF_ColBERT's projection: `linear.weight` of the folder's own weights, bias-free, as a token head."""
    weights = read_module_state(folder)
    weight = weights.get("linear.weight")
    if weight is None or weight.ndim != 2 or weight.shape[1] != hidden_size:
        raise LoadError(f"{folder} names HF_ColBERT but holds no linear.weight of {hidden_size} inputs.")
    head = DenseHead(folder, hidden_size, int(weight.shape[0]), False, "torch.nn.modules.linear.Identity")
    dense = Dense(head)
    dense.linear.weight.data.copy_(weight)
    return torch.nn.Sequential(dense).to(device=device, dtype=torch.float32).eval()


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
