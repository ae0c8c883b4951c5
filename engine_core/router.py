"""A Router model (engine_core/st_router.py): a query's chain and a document's, loaded and run side by side; each
input of a batch runs through its role's chain. A SentenceTransformer's chains are each a transformer, its pooling and
heads; an inference-free SPLADE's (st_sparse.py) are a SparseStaticEmbedding for queries (each token present weighs
its trained weight: no model runs) and a SPLADE model for documents.

The API servers tokenize for both with one tokenizer, so the routes must tokenize alike (the same tokenizer, lower
casing and maximum length; a SparseStaticEmbedding adds no special tokens, which the card says); they send a
request's query-route inputs first and count them (`PoolingParams.queries`), as they do a late-interaction model's
queries. A batch that mixes the two runs each chain on its own inputs.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import msgspec
import numpy as np
import numpy.typing as npt
import torch
from tokenizers import Tokenizer
from transformers import AutoConfig, AutoTokenizer, PretrainedConfig

from engine_core.folder_choices import (
    LoadError,
    choose_max_model_len,
    choose_pooling,
    choose_prompts,
    first_line,
    measure_prompt_lengths,
    model_kind,
    not_exact,
    pad_token_id_of,
    select_dtype,
    served_tokenizer,
    tasks_of,
)
from engine_core.loader import (
    LoadedModel,
    batch_caps,
    load_folder,
    load_weights,
    measure_batch_overhead,
    uses_token_packing,
)
from engine_core.own_code import check_own_code, code_not_found, untrusted_config
from engine_core.runner import EmbeddingRunner, ModelRunner, Rows, to_numpy
from engine_core.st_heads import build_heads, read_module_state
from engine_core.st_modules import MetadataError, StFolder
from poolserve.config import Config
from poolserve.model_card import EMBEDDING, ModelCard

logger = logging.getLogger("poolserve.engine")
F32 = npt.NDArray[np.float32]


class RouterRunner:
    """Each input through its role's chain: the query's where `is_query`, else the document's."""

    def __init__(self, query: ModelRunner, document: ModelRunner):
        self.query = query
        self.document = document

    def run_routed(
        self,
        rows: Rows,
        type_rows: Rows | None,
        is_query: Sequence[bool],
        per_token: Sequence[bool],
        pool_from: Sequence[int] | None = None,
    ) -> list[F32]:
        out: list[F32] = [np.empty(0, dtype=np.float32)] * len(rows)
        for runner, role in ((self.query, True), (self.document, False)):
            which = [i for i, query in enumerate(is_query) if query == role]
            if not which:
                continue
            types = None if type_rows is None else [type_rows[i] for i in which]
            asked = [per_token[i] for i in which]
            starts = None if pool_from is None else [pool_from[i] for i in which]
            results = (
                runner.run_texts_per_token([rows[i] for i in which], types, asked, starts)
                if any(asked) or starts is not None
                else list(runner.run_texts([rows[i] for i in which], types))
            )
            for i, result in zip(which, results, strict=True):
                out[i] = result
        return out

    def run_texts(self, rows: Rows, type_rows: Rows | None) -> F32:
        """Inputs with no role given to the engine (its own warm-up and measurements) take the document's chain."""
        return self.document.run_texts(rows, type_rows)

    def run_texts_per_token(
        self, rows: Rows, type_rows: Rows | None, per_token: Sequence[bool], pool_from: Sequence[int] | None = None
    ) -> list[F32]:
        return self.document.run_texts_per_token(rows, type_rows, per_token, pool_from)

    def run_images(self, pixels: npt.NDArray[np.uint8]) -> F32:
        raise TypeError("this model takes no images")


@dataclass(frozen=True, slots=True)
class Route:
    """One chain as loaded: its transformers config, tokenizer, runner, and what the card says of it."""

    name: str
    model_config: PretrainedConfig
    tokenizer_json: str
    max_model_len: int
    pad_token_id: int
    pooling: tuple[str, ...]
    runner: EmbeddingRunner
    packed: bool
    dtype: torch.dtype
    special_ids: tuple[int, ...]


def load_router_model(config: Config, folder: Path, st: StFolder, device: torch.device) -> LoadedModel:
    """Both chains of a Router folder, in the dtype --dtype names (float32 for `auto` on a CPU: the bf16 probe
    measures one chain), refused where they do not tokenize alike or give vectors of different widths."""
    assert st.router is not None
    if st.router.query.sparse_static_folder is not None:
        return load_inference_free(config, folder, st, device)
    if config.pooling != "auto":
        raise LoadError(f"--pooling {config.pooling} does not apply to a Router model (each route pools its own way).")
    if config.score_template or config.score_tokens or config.score_format != "none":
        raise LoadError("--score-template, --score-tokens and --score-format apply to rerankers; this is an "
                        "embedding model.")  # fmt: skip
    models: dict[Path, torch.nn.Module] = {}  # routes may share a Transformer module
    routes = [
        load_route(config, folder, name, chain, device, models=models)
        for name, chain in zip(st.router.names, (st.router.query, st.router.document), strict=True)
    ]
    query, document = routes
    for what, first, second in (
        ("tokenize differently (their tokenizers differ)", query.tokenizer_json, document.tokenizer_json),
        (f"cut texts at different lengths ({query.max_model_len}, {document.max_model_len})", query.max_model_len,
         document.max_model_len),
        ("pad with different tokens", query.pad_token_id, document.pad_token_id),
    ):  # fmt: skip
        if first != second:
            raise not_exact(folder, MetadataError(
                f"the Router's routes {query.name!r} and {document.name!r} {what}; poolserve's API servers tokenize "
                "every text one way"
            ))  # fmt: skip
    runner = RouterRunner(query.runner, document.runner)
    backend_json = query.tokenizer_json
    warm_up = np.asarray(Tokenizer.from_str(backend_json).encode("warm up").ids, dtype=np.int32)
    widths = {route.name: int(route.runner.run_texts([warm_up], None).shape[1]) for route in routes}
    if len(set(widths.values())) > 1:
        raise not_exact(folder, MetadataError(f"the Router's routes give vectors of different widths ({widths})"))
    prompts, default_prompt = choose_prompts(config, st, EMBEDDING)
    max_model_len = query.max_model_len
    prompt_lengths = {}
    if not st.pooling_includes_prompt:
        prompt_lengths = measure_prompt_lengths(
            [*prompts.values(), default_prompt], Tokenizer.from_str(backend_json), query.special_ids, max_model_len
        )
    max_batch_tokens, max_batch_size = batch_caps(config, device, max_model_len)
    packed = query.packed and document.packed
    type_vocab = min(int(getattr(route.model_config, "type_vocab_size", 0) or 0) for route in routes)
    pooling = "+".join(query.pooling)
    if query.pooling != document.pooling:
        pooling = f"query {pooling}, document {'+'.join(document.pooling)}"
    card = ModelCard(
        path=str(folder),
        architecture="Router(" + ", ".join(arch_of(route.model_config) for route in routes) + ")",
        kind=EMBEDDING, tasks=tasks_of(EMBEDDING, 0), max_model_len=max_model_len, output_size=widths[query.name],
        vocab_size=min(int(route.model_config.vocab_size) for route in routes), pooling=pooling,
        normalize=st.normalize is True, pad_token_id=query.pad_token_id, tokenizer_json=backend_json,
        device=str(device), dtype="+".join(sorted({str(route.dtype).removeprefix("torch.") for route in routes})),
        uses_token_types=type_vocab > 1, max_batch_tokens=max_batch_tokens, max_batch_size=max_batch_size,
        type_vocab_size=type_vocab, prompts=prompts, default_prompt=default_prompt, similarity=st.similarity,
        prompt_lengths=prompt_lengths, default_route=st.router.default,
    )  # fmt: skip
    overhead = 0.0
    if not packed:
        overhead = measure_batch_overhead(
            runner, warm_up, max_model_len, cap=max_batch_tokens,
            large_rows=16 if device.type == "cpu" else max(16, min(max_batch_size, max_batch_tokens // 64)),
        )  # fmt: skip
    return LoadedModel(card=card, runner=runner, batch_overhead_tokens=overhead, packs_tokens=packed)


def arch_of(model_config: PretrainedConfig) -> str:
    return str((model_config.architectures or [model_config.model_type])[0])


def load_route(
    config: Config,
    folder: Path,
    name: str,
    chain: StFolder,
    device: torch.device,
    *,
    models: dict[Path, torch.nn.Module],
) -> Route:
    """One route's transformer (loaded once however many routes run it), pooling and heads."""
    assert chain.transformer_folder is not None
    where = chain.transformer_folder
    trust = config.trust_remote_code
    try:
        model_config = AutoConfig.from_pretrained(where, trust_remote_code=trust)
        tokenizer = AutoTokenizer.from_pretrained(where, trust_remote_code=trust)
    except Exception as exc:
        if (refusal := code_not_found(where) if trust else untrusted_config(where)) is not None:
            raise refusal from exc
        raise LoadError(f"cannot load the Router's route {name!r} from {where}: {first_line(exc)}") from exc
    if not tokenizer.is_fast:
        raise LoadError(f"{where} has no fast tokenizer (tokenizer.json), which the API servers need.")
    if model_kind(model_config, chain) != EMBEDDING:
        raise LoadError(f"the Router's route {name!r} runs a {model_config.model_type} model, not a text encoder.")
    check_own_code(model_config, "AutoModel", trust)
    pooling = choose_pooling("auto", chain, model_config)
    max_model_len = choose_max_model_len(
        config.max_model_len, tokenizer.model_max_length, model_config, chain.max_seq_length
    )
    dtype = select_dtype(config.dtype, device, model_config)
    if where not in models:
        models[where] = load_weights("AutoModel", where, dtype, trust).to(device).eval()
    model = models[where]
    try:
        heads = build_heads(chain.heads, device)
    except MetadataError as exc:
        raise not_exact(folder, exc) from exc
    pad_token_id = pad_token_id_of(tokenizer, model_config)
    backend = served_tokenizer(tokenizer, chain.do_lower_case)
    packed = uses_token_packing(config.token_packing, device, model)
    runner = EmbeddingRunner(
        model, pooling=pooling, pad_token_id=pad_token_id, device=device, packed=packed, heads=heads
    )
    return Route(
        name, model_config, backend.to_str(), max_model_len, int(pad_token_id), pooling, runner, packed,
        dtype, tuple(tokenizer.all_special_ids),
    )  # fmt: skip


class SparseStaticRunner:
    """An inference-free SPLADE's queries (SparseStaticEmbedding): a vocabulary-wide row per input, each token id
    present in it at its trained weight, the others zero."""

    def __init__(self, weight: torch.Tensor, device: torch.device):
        self.weight = weight.to(device=device, dtype=torch.float32)
        self.device = device

    def run_texts(self, rows: Rows, type_rows: Rows | None) -> F32:
        with torch.inference_mode():
            lengths = torch.as_tensor([len(row) for row in rows], device=self.device)
            ids = torch.from_numpy(np.concatenate(rows).astype(np.int64)).to(self.device)
            which = torch.repeat_interleave(torch.arange(len(rows), device=self.device), lengths)
            out = torch.zeros(len(rows), self.weight.shape[0], dtype=torch.float32, device=self.device)
            out[which, ids] = self.weight[ids]
            return to_numpy(out)

    def run_texts_per_token(
        self, rows: Rows, type_rows: Rows | None, per_token: Sequence[bool], pool_from: Sequence[int] | None = None
    ) -> list[F32]:
        raise TypeError("this model gives no token states")  # the engine refuses such requests first

    def run_images(self, pixels: npt.NDArray[np.uint8]) -> F32:
        raise TypeError("this model takes no images")


def load_inference_free(config: Config, folder: Path, st: StFolder, device: torch.device) -> LoadedModel:
    """An inference-free SPLADE: its document chain loaded as any SPLADE folder is, its queries' weights beside it,
    refused where the query's tokenizer is not the document's (the same texts, special tokens aside, at the same
    maximum length) or its weights do not cover the vocabulary."""
    assert st.router is not None and st.router.query.sparse_static_folder is not None
    static = st.router.query.sparse_static_folder
    document = load_folder(config, folder, replace(st, router=None), device)
    try:
        tokenizer = AutoTokenizer.from_pretrained(static)
        weight = read_module_state(static)["weight"]
    except MetadataError as exc:
        raise not_exact(folder, exc) from exc
    except (OSError, ValueError, KeyError) as exc:
        raise LoadError(f"cannot load the SparseStaticEmbedding in {static}: {first_line(exc)}") from exc
    backend = served_tokenizer(tokenizer)
    card = document.card
    names = st.router.names
    refusal = ""
    if backend.to_str() != card.tokenizer_json:
        refusal = "tokenize differently (their tokenizers differ)"
    elif tokenizer.model_max_length != card.max_model_len:
        refusal = f"cut texts at different lengths ({tokenizer.model_max_length}, {card.max_model_len})"
    elif tuple(weight.shape) != (card.output_size,):
        refusal = f"give vectors of different widths ({tuple(weight.shape)}, {card.output_size})"
    if refusal:
        raise not_exact(folder, MetadataError(
            f"the Router's routes {names[0]!r} and {names[1]!r} {refusal}; poolserve's API servers tokenize every "
            "text one way"
        ))  # fmt: skip
    card = msgspec.structs.replace(
        card, architecture=f"Router(SparseStaticEmbedding, {card.architecture})", default_route=st.router.default,
        query_special_tokens=False,
    )  # fmt: skip
    runner = RouterRunner(SparseStaticRunner(weight, device), document.runner)
    return replace(document, card=card, runner=runner)
