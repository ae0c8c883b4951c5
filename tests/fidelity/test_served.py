"""Every served layout of docs/models.md, through the HTTP endpoints, equal to the reference library in float32.

The reference is sentence-transformers 6 (SentenceTransformer, CrossEncoder, SparseEncoder, MultiVectorEncoder)
on the same folder: its `encode` with the default prompt, a named prompt, `encode_query` and `encode_document`;
its `similarity` for /rerank by a bi-encoder and MaxSim by a late-interaction model; `CrossEncoder.predict` for
a cross-encoder's scores; `SparseEncoder.encode` for a sparse model's vectors (the same non-zero indices, values
within 1e-4) and its `max_active_dims` for pruning; FlagEmbedding's BGEM3FlagModel for bge-m3's three outputs.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import cohere
import httpx
import numpy as np
import pytest
import torch

from engine_core.loader import LoadedModel
from tests.fidelity.bge_m3_layouts import bge_m3_reference
from tests.fidelity.compare import DOCUMENTS, F32, QUERY, TEXTS, assert_same
from tests.fidelity.format_layouts import GEMMA_PROMPT, gemma_scores, mxbai_scores
from tests.fidelity.layouts import SERVED, Served
from tests.fidelity.models_doc import documented_rows
from tests.fidelity.reranker_layouts import qwen3_card_scores
from tests.fidelity.stack import AppTransport, load, serve_in_process

LONG = " ".join(["tokens"] * 200)


@pytest.fixture(scope="module", params=SERVED, ids=[case.id for case in SERVED])
def case(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Served, Path]]:
    layout: Served = request.param
    folder = tmp_path_factory.mktemp("layouts") / layout.id
    layout.build(folder)
    yield layout, folder


def embeddings(client: httpx.Client, body: dict[str, Any]) -> F32:
    """Cut to the model's maximum from the right, as sentence-transformers always cuts (poolserve refuses
    an over-long text unless asked to cut it)."""
    response = client.post("/v1/embeddings", json={**body, "truncate_prompt_tokens": -1})
    assert response.status_code == 200, response.text
    return np.asarray([item["embedding"] for item in response.json()["data"]], dtype=np.float32)


def test_the_layout_is_served_as_its_reference_library_computes_it(case: tuple[Served, Path]) -> None:
    layout, folder = case
    flags = layout.flags_for(folder)
    loaded = load(folder, **flags)
    check_documented_pass(layout.id, loaded)
    with serve_in_process(loaded, **flags) as client:
        if layout.reference == "cross":
            check_cross_encoder(client, folder)
        elif layout.reference in ("llm", "qwen3_card"):
            check_llm_reranker(client, folder, card_code=layout.reference == "qwen3_card")
        elif layout.reference == "mxbai":
            check_mxbai_reranker(client, folder)
        elif layout.reference == "gemma":
            check_gemma_reranker(client, folder)
        elif layout.reference == "sparse":
            check_sparse_encoder(client, folder)
        elif layout.reference == "multi_vector":
            check_multi_vector(client, folder)
        elif layout.reference == "image_text":
            check_image_text(client, folder)
        elif layout.reference == "bge_m3":
            check_bge_m3(client, folder)
        else:
            plain = layout.reference == "plain"
            one_by_one = layout.reference == "one_by_one" or plain
            trust = bool(flags.get("trust_remote_code"))
            check_embedder(
                client, folder, one_by_one=one_by_one, normalized=plain, trust_remote_code=trust,
                as_built=layout.as_built,
            )  # fmt: skip


def check_documented_pass(layout_id: str, loaded: LoadedModel) -> None:
    """docs/models.md's "packed or padded (CPU)" column says how the engine runs the layout's model on a CPU."""
    documented = documented_rows()[layout_id].rstrip(" |").rsplit("|", 1)[-1].strip()
    if documented == "packed":
        assert loaded.packs_tokens, f"{layout_id} is documented packed but runs padded"
    elif documented.startswith("padded"):
        assert not loaded.packs_tokens, f"{layout_id} is documented padded but runs packed"


def check_embedder(
    client: httpx.Client,
    folder: Path,
    *,
    one_by_one: bool,
    normalized: bool = False,
    trust_remote_code: bool = False,
    as_built: Callable[[torch.nn.Module], None] | None = None,
) -> None:
    """`normalized`: a folder without Sentence-Transformers files, whose vectors poolserve normalizes (as OpenAI's)
    where sentence-transformers adds no Normalize. `trust_remote_code`: the folder's own code runs in both.
    `as_built`: what the reference's transformer needs to be the model its code builds (see Served)."""
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(folder), device="cpu", trust_remote_code=trust_remote_code)
    if as_built is not None:
        as_built(model[0].auto_model)

    def reference(texts: list[str], method: str = "encode", **kwargs: Any) -> F32:
        encode = getattr(model, method)
        if one_by_one:  # a causal model's padded rows move in sentence-transformers' own batches
            rows = np.concatenate([encode([text], **kwargs) for text in texts])
        else:
            rows = np.asarray(encode(texts, **kwargs))
        return rows / np.linalg.norm(rows, axis=1, keepdims=True) if normalized else rows

    assert_same(embeddings(client, {"input": TEXTS}), reference(TEXTS))
    assert_same(embeddings(client, {"input": [LONG]}), reference([LONG]))
    # Voyage's input_type picks the prompt encode_query / encode_document pick.
    assert_same(embeddings(client, {"input": TEXTS, "input_type": "query"}), reference(TEXTS, "encode_query"))
    assert_same(embeddings(client, {"input": TEXTS, "input_type": "document"}), reference(TEXTS, "encode_document"))
    for name in model.prompts:  # TEI's /embed normalizes unless told not to
        tei = client.post("/embed", json={"inputs": TEXTS, "prompt_name": name, "truncate": True})
        assert tei.status_code == 200, tei.text
        named = reference(TEXTS, prompt_name=name)
        assert_same(np.asarray(tei.json(), dtype=np.float32), named / np.linalg.norm(named, axis=1, keepdims=True))
    # A bi-encoder reranks by the model's similarity of the query's and the documents' embeddings.
    ranked = client.post("/v1/rerank", json={"query": QUERY, "documents": DOCUMENTS})
    assert ranked.status_code == 200, ranked.text
    scores = {item["index"]: item["relevance_score"] for item in ranked.json()["results"]}
    expected = model.similarity(reference([QUERY], "encode_query"), reference(DOCUMENTS, "encode_document"))[0]
    np.testing.assert_allclose([scores[i] for i in range(len(DOCUMENTS))], expected.numpy(), atol=1e-5, rtol=1e-4)
    # An output the model does not have (bge-m3's) is refused by name.
    other = client.post("/v1/rerank", json={"query": QUERY, "documents": DOCUMENTS, "output": "sparse"})
    assert other.status_code == 400 and other.json()["error"]["param"] == "output", other.text
    # usage counts every token the model read, the prompt's included.
    usage = client.post("/v1/embeddings", json={"input": TEXTS, "truncate_prompt_tokens": -1}).json()["usage"]
    usage = usage["prompt_tokens"]
    prompt = model.prompts.get(model.default_prompt_name or "", "")
    # (a Transformer gives a batch of rows; a StaticEmbedding, one row of every text's ids end to end)
    assert usage == sum(model.tokenize([prompt + text])["input_ids"].shape[-1] for text in TEXTS)


def check_image_text(client: httpx.Client, folder: Path) -> None:
    """SigLIP: texts (one cut at its 64 tokens) and images, apart and in one request, raw (`normalize: false`) and
    normalized (its default, as CLIP's), equal to get_text_features / get_image_features on what transformers'
    processor makes of them; `usage` counts the texts' own tokens, not their padding."""
    from tests.fidelity.image_text_layouts import ImageTextReference
    from tests.images import data_url, encode, make_image

    reference = ImageTextReference(folder)
    texts = [*TEXTS, LONG]
    assert_same(embeddings(client, {"input": texts, "normalize": False}), reference.texts(texts))
    assert_same(embeddings(client, {"input": texts}), reference.texts(texts, normalized=True))
    images = [make_image(64, 48, 1), make_image(30, 90, 2), make_image(32, 32, 3, "L"), make_image(17, 5, 4, "RGBA")]
    sources = [{"image": data_url(encode(image))} for image in images]
    assert_same(embeddings(client, {"input": sources, "normalize": False}), reference.images(images))
    mixed = embeddings(client, {"input": [TEXTS[0], sources[0], TEXTS[1], sources[1]]})
    rows = [reference.texts(TEXTS[:2], normalized=True), reference.images(images[:2], normalized=True)]
    assert_same(mixed, np.stack([rows[0][0], rows[1][0], rows[0][1], rows[1][1]]))
    usage = client.post("/v1/embeddings", json={"input": TEXTS}).json()["usage"]["prompt_tokens"]
    assert usage == sum(len(reference.processor.tokenizer(text)["input_ids"]) for text in TEXTS)


def check_cross_encoder(client: httpx.Client, folder: Path) -> None:
    from sentence_transformers import CrossEncoder

    model = CrossEncoder(str(folder), device="cpu")
    expected = model.predict([(QUERY, document) for document in DOCUMENTS])
    ranked = client.post("/v1/rerank", json={"query": QUERY, "documents": DOCUMENTS})
    assert ranked.status_code == 200, ranked.text
    scores = {item["index"]: item["relevance_score"] for item in ranked.json()["results"]}
    np.testing.assert_allclose([scores[i] for i in range(len(DOCUMENTS))], expected, atol=1e-5, rtol=1e-4)
    tei = client.post("/rerank", json={"query": QUERY, "texts": DOCUMENTS})
    assert tei.status_code == 200, tei.text
    tei_scores = {item["index"]: item["score"] for item in tei.json()}
    np.testing.assert_allclose([tei_scores[i] for i in range(len(DOCUMENTS))], expected, atol=1e-5, rtol=1e-4)


INSTRUCTION = "Judge whether the passage names a place"
LONG_DOCUMENT = " ".join(["servers run in racks and racks"] * 40)


def rerank_scores(client: httpx.Client, body: dict[str, Any]) -> list[float]:
    ranked = client.post("/v1/rerank", json={"query": QUERY, "documents": DOCUMENTS, **body})
    assert ranked.status_code == 200, ranked.text
    scores = {item["index"]: item["relevance_score"] for item in ranked.json()["results"]}
    return [scores[i] for i in range(len(scores))]


def check_llm_reranker(client: httpx.Client, folder: Path, *, card_code: bool) -> None:
    """An LLM reranker: pairs rendered by its template, scored from its logits, as CrossEncoder.predict (or the
    Qwen3-Reranker card's code) scores them: with the default instruction and a request's own, and with a document
    cut to the model's maximum (the template's tail kept)."""
    pairs = [(QUERY, document) for document in DOCUMENTS]
    long_pairs = [(QUERY, LONG_DOCUMENT)]
    max_model_len = client.get("/info").json()["max_input_length"]
    if card_code:
        expected = qwen3_card_scores(folder, pairs)
        instructed = qwen3_card_scores(folder, pairs, INSTRUCTION)
        cut = qwen3_card_scores(folder, long_pairs, max_length=max_model_len)
    else:
        from sentence_transformers import CrossEncoder

        model = CrossEncoder(str(folder), device="cpu")
        assert model.max_seq_length == max_model_len
        expected = model.predict(pairs).tolist()
        instructed = model.predict(pairs, prompt=INSTRUCTION).tolist()
        cut = model.predict(long_pairs).tolist()
    np.testing.assert_allclose(rerank_scores(client, {}), expected, atol=1e-5, rtol=1e-4)
    np.testing.assert_allclose(rerank_scores(client, {"instruction": INSTRUCTION}), instructed, atol=1e-5, rtol=1e-4)
    tei = client.post("/rerank", json={"query": QUERY, "texts": [LONG_DOCUMENT], "truncate": True})
    assert tei.status_code == 200, tei.text
    np.testing.assert_allclose([tei.json()[0]["score"]], cut, atol=1e-5, rtol=1e-4)
    score = client.post("/score", json={"text_1": QUERY, "text_2": DOCUMENTS})
    assert score.status_code == 200, score.text
    np.testing.assert_allclose([item["score"] for item in score.json()["data"]], expected, atol=1e-5, rtol=1e-4)
    # Cohere's own client reranks with it (over the in-process app).
    name = client.get("/v1/models").json()["data"][0]["id"]
    with httpx.Client(transport=AppTransport(client)) as http:
        cohere_client = cohere.ClientV2(api_key="unused", base_url=str(client.base_url), httpx_client=http)
        results = cohere_client.rerank(model=name, query=QUERY, documents=DOCUMENTS).results
    assert [result.index for result in results] == sorted(range(len(expected)), key=lambda i: -expected[i])
    np.testing.assert_allclose([result.relevance_score for result in results], sorted(expected, reverse=True),
                               atol=1e-5, rtol=1e-4)  # fmt: skip
    # Uncut, the long pair is refused as any over-long input is; and a single text is nothing a reranker scores.
    assert client.post("/rerank", json={"query": QUERY, "texts": [LONG_DOCUMENT]}).status_code == 413
    assert client.post("/classify", json={"input": ["a text"]}).status_code == 400
    assert client.post("/predict", json={"inputs": [["a query", "a document"]]}).status_code == 424


LONG_QUERY = " ".join(["where are the servers and why"] * 60)


def served_scores(client: httpx.Client, query: str, documents: list[str], **body: Any) -> list[float]:
    ranked = client.post("/v1/rerank", json={"query": query, "documents": documents, **body})
    assert ranked.status_code == 200, ranked.text
    scores = {item["index"]: item["relevance_score"] for item in ranked.json()["results"]}
    return [scores[i] for i in range(len(scores))]


def assert_same_scores(served: list[float], expected: list[float]) -> None:
    np.testing.assert_allclose(served, expected, atol=1e-4, rtol=0)
    assert np.argsort(served, kind="stable").tolist() == np.argsort(expected, kind="stable").tolist()


def check_mxbai_reranker(client: httpx.Client, folder: Path) -> None:
    """--score-format mxbai-rerank-v2 against the mxbai-rerank package's MxbaiRerankV2.predict: its logits (also
    the activation-on score: rank() ranks by them), a request's instruction, a long document and a long query cut
    as the package cuts them (the query to 3/4 of its max_length)."""
    pairs = [(QUERY, document) for document in DOCUMENTS]
    expected = mxbai_scores(folder, pairs)
    assert_same_scores(served_scores(client, QUERY, DOCUMENTS), expected)
    assert_same_scores(served_scores(client, QUERY, DOCUMENTS, use_activation=False), expected)
    instructed = mxbai_scores(folder, pairs, INSTRUCTION)
    assert_same_scores(served_scores(client, QUERY, DOCUMENTS, instruction=INSTRUCTION), instructed)
    long_document = " ".join([LONG_DOCUMENT] * 3)
    cut = mxbai_scores(folder, [(QUERY, long_document), (LONG_QUERY, DOCUMENTS[0]), (LONG_QUERY, long_document)])
    tei = client.post(
        "/rerank", json={"query": QUERY, "texts": [long_document, *DOCUMENTS], "truncate": True, "raw_scores": True}
    )
    assert tei.status_code == 200, tei.text
    by_index = {item["index"]: item["score"] for item in tei.json()}
    assert_same_scores([by_index[0]], cut[:1])
    truncated = served_scores(client, LONG_QUERY, [DOCUMENTS[0], long_document], truncate_prompt_tokens=-1)
    assert_same_scores(truncated, cut[1:])
    score = client.post("/score", json={"text_1": QUERY, "text_2": DOCUMENTS, "instruction": INSTRUCTION})
    assert score.status_code == 200, score.text
    assert_same_scores([item["score"] for item in score.json()["data"]], instructed)
    # Uncut, a pair the package would cut is refused; so are the cuts it does not make.
    assert client.post("/rerank", json={"query": QUERY, "texts": [long_document]}).status_code == 413
    assert client.post("/v1/rerank", json={"query": LONG_QUERY, "documents": ["x"]}).status_code == 400
    left = {"query": QUERY, "texts": [long_document], "truncate": True, "truncation_direction": "Left"}
    refused = client.post("/rerank", json=left)
    assert refused.status_code == 413 and "from the right only" in refused.text, refused.text
    per_doc = {"query": QUERY, "documents": DOCUMENTS, "max_tokens_per_doc": 4}
    name = client.get("/v1/models").json()["data"][0]["id"]
    assert client.post("/v2/rerank", json={**per_doc, "model": name}).status_code == 400


def check_gemma_reranker(client: httpx.Client, folder: Path) -> None:
    """--score-format bge-reranker-v2-gemma against FlagLLMReranker.compute_score (transcribed): its sigmoid
    (normalize=True) with the activation, the "Yes" logit raw, a long document cut at the max_length that fills the
    model's maximum; an instruction refused (its prompt has none)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    tail = len(tokenizer("\n" + GEMMA_PROMPT, add_special_tokens=False)["input_ids"])
    max_length = client.get("/info").json()["max_input_length"] - 2 * tail
    pairs = [(QUERY, document) for document in DOCUMENTS]
    raw = gemma_scores(folder, pairs, max_length=max_length)
    assert_same_scores(served_scores(client, QUERY, DOCUMENTS, use_activation=False), raw)
    normalized = gemma_scores(folder, pairs, max_length=max_length, normalize=True)
    assert_same_scores(served_scores(client, QUERY, DOCUMENTS), normalized)
    long_document = " ".join([LONG_DOCUMENT] * 3)
    cut = gemma_scores(folder, [(QUERY, long_document), (LONG_QUERY, long_document)], max_length=max_length)
    for query, expected in ((QUERY, cut[0]), (LONG_QUERY, cut[1])):
        body = {"query": query, "texts": [long_document], "truncate": True, "raw_scores": True}
        tei = client.post("/rerank", json=body)
        assert tei.status_code == 200, tei.text
        assert_same_scores([tei.json()[0]["score"]], [expected])
    assert client.post("/rerank", json={"query": QUERY, "texts": [long_document]}).status_code == 413
    refused = client.post("/v1/rerank", json={"query": QUERY, "documents": DOCUMENTS, "instruction": INSTRUCTION})
    assert refused.status_code == 400 and "instruction" in refused.text


Entries = list[list[dict[str, Any]]]


def assert_same_sparse(served: Entries, reference: Any) -> None:
    """Each served vector ({index, value} in index order) has the reference row's non-zero indices and values."""
    dense = reference.to_dense().numpy()
    assert len(served) == len(dense)
    for entries, row in zip(served, dense, strict=True):
        indices = [entry["index"] for entry in entries]
        assert indices == sorted(indices)
        np.testing.assert_array_equal(indices, np.flatnonzero(row))
        np.testing.assert_allclose([entry["value"] for entry in entries], row[indices], atol=1e-4, rtol=0)


def embed_sparse(client: httpx.Client, body: dict[str, Any]) -> Entries:
    response = client.post("/embed_sparse", json={"truncate": True, **body})
    assert response.status_code == 200, response.text
    served: Entries = response.json()
    return served


def check_sparse_encoder(client: httpx.Client, folder: Path) -> None:
    from sentence_transformers import SparseEncoder

    model = SparseEncoder(str(folder), device="cpu")
    assert_same_sparse(embed_sparse(client, {"inputs": TEXTS}), model.encode(TEXTS))
    assert_same_sparse(embed_sparse(client, {"inputs": [LONG]}), model.encode([LONG]))
    # Enough tokens for the engine's MLM head to run in several chunks, inputs straddling their edges.
    many = [f"{text} {i}" for i in range(12) for text in TEXTS]
    assert_same_sparse(embed_sparse(client, {"inputs": many}), model.encode(many))
    for name in model.prompts:
        named = embed_sparse(client, {"inputs": TEXTS, "prompt_name": name})
        assert_same_sparse(named, model.encode(TEXTS, prompt_name=name))
    # A role: its prompt, and an inference-free SPLADE's route (per-token weights for queries).
    assert_same_sparse(embed_sparse(client, {"inputs": TEXTS, "input_type": "query"}), model.encode_query(TEXTS))
    assert_same_sparse(embed_sparse(client, {"inputs": TEXTS, "input_type": "document"}), model.encode_document(TEXTS))
    pooled = client.post("/pooling", json={"input": TEXTS, "truncate_prompt_tokens": -1})
    assert pooled.status_code == 200, pooled.text
    assert_same_sparse([item["data"] for item in pooled.json()["data"]], model.encode(TEXTS))
    # normalize: the vectors encode returns (after the folder's max_active_dims), L2-normalized.
    unit = client.post("/pooling", json={"input": TEXTS, "truncate_prompt_tokens": -1, "normalize": True})
    assert unit.status_code == 200, unit.text
    dense = model.encode(TEXTS).to_dense()
    normalized = dense / dense.norm(dim=1, keepdim=True)
    assert_same_sparse([item["data"] for item in unit.json()["data"]], normalized.to_sparse())
    # Pruning: the top k as max_active_dims keeps them; a threshold keeps the values above it.
    top = embed_sparse(client, {"inputs": TEXTS, "sparse_top_k": 7})
    assert_same_sparse(top, model.encode(TEXTS, max_active_dims=7))
    reference = model.encode(TEXTS).to_dense()
    threshold = float(reference[reference > 0].median())
    above = client.post("/pooling", json={"input": TEXTS, "truncate_prompt_tokens": -1, "sparse_threshold": threshold})
    assert above.status_code == 200, above.text
    kept = reference * (reference > threshold)
    assert_same_sparse([item["data"] for item in above.json()["data"]], kept.to_sparse())
    # The model's similarity (the dot product) of the query's and the documents' sparse vectors.
    with warnings.catch_warnings():
        # torch's notice, once per process, from the reference's own sparse similarity: whichever test of the
        # process reaches it first sees it, so it cannot be an error here (the suite runs over several workers).
        warnings.filterwarnings("ignore", "Sparse CSR tensor support is in beta", UserWarning)
        expected = model.similarity(model.encode_query([QUERY]), model.encode_document(DOCUMENTS))[0].numpy()
    ranked = client.post("/v1/rerank", json={"query": QUERY, "documents": DOCUMENTS})
    assert ranked.status_code == 200, ranked.text
    scores = {item["index"]: item["relevance_score"] for item in ranked.json()["results"]}
    np.testing.assert_allclose([scores[i] for i in range(len(DOCUMENTS))], expected, atol=1e-4, rtol=1e-5)


def assert_same_tokens(served: list[F32], reference: list[Any]) -> None:
    """Each input's token vectors: as many, each at cosine >= 0.9999 with the reference's."""
    assert len(served) == len(reference)
    for vectors, expected in zip(served, reference, strict=True):
        assert_same(vectors, np.asarray(expected, dtype=np.float32))


def token_vectors(client: httpx.Client, path: str, body: dict[str, Any]) -> list[F32]:
    response = client.post(path, json=body)
    assert response.status_code == 200, response.text
    answer = response.json()
    matrices = [item["data"] for item in answer["data"]] if path == "/pooling" else answer
    return [np.asarray(matrix, dtype=np.float32) for matrix in matrices]


def check_multi_vector(client: httpx.Client, folder: Path) -> None:
    """A late-interaction model: token vectors of queries, documents and texts with no role, as the reference's
    encode_query, encode_document and encode give them, and MaxSim scores as its similarity computes them. Over-long
    texts are cut (the reference always cuts; poolserve when asked), a query's at its role's length."""
    from sentence_transformers import MultiVectorEncoder

    model = MultiVectorEncoder(str(folder), device="cpu")
    texts = [*TEXTS, LONG]
    references = {
        None: model.encode(texts),
        "query": model.encode_query(texts),
        "document": model.encode_document(texts),
    }
    for role, reference in references.items():
        typed = {} if role is None else {"input_type": role}
        pooling = token_vectors(
            client, "/pooling", {"input": texts, "task": "token_embed", "truncate_prompt_tokens": -1, **typed}
        )
        assert_same_tokens(pooling, reference)
        # /pooling's own output on such a model is its token vectors.
        assert_same_tokens(
            token_vectors(client, "/pooling", {"input": texts, "truncate_prompt_tokens": -1, **typed}), reference
        )
        assert_same_tokens(token_vectors(client, "/embed_all", {"inputs": texts, "truncate": True, **typed}), reference)
    # TEI's prompt_name: that prompt, the text in no role (as `encode(prompt_name=...)`).
    named = token_vectors(client, "/embed_all", {"inputs": TEXTS, "prompt_name": "query"})
    assert_same_tokens(named, model.encode(TEXTS, prompt_name="query"))
    both = client.post("/embed_all", json={"inputs": TEXTS, "prompt_name": "query", "input_type": "query"})
    assert both.status_code == 413 and "input_type" in both.text, both.text  # TEI's validation status
    # MaxSim of the query's vectors against each document's, on every scoring endpoint and shape.
    documents = [*DOCUMENTS, LONG]
    expected = model.similarity(model.encode_query([QUERY]), model.encode_document(documents))[0].numpy()
    ranked = client.post("/v1/rerank", json={"query": QUERY, "documents": documents, "truncate_prompt_tokens": -1})
    assert ranked.status_code == 200, ranked.text
    results = ranked.json()["results"]
    assert [item["index"] for item in results] == np.argsort(-expected, kind="stable").tolist()
    scores = {item["index"]: item["relevance_score"] for item in results}
    np.testing.assert_allclose([scores[i] for i in range(len(documents))], expected, atol=1e-4, rtol=1e-5)
    tei = client.post("/rerank", json={"query": QUERY, "texts": documents, "truncate": True})
    assert tei.status_code == 200, tei.text
    tei_scores = {item["index"]: item["score"] for item in tei.json()}
    np.testing.assert_allclose([tei_scores[i] for i in range(len(documents))], expected, atol=1e-4, rtol=1e-5)
    one_to_many = client.post("/score", json={"text_1": QUERY, "text_2": documents, "truncate_prompt_tokens": -1})
    assert one_to_many.status_code == 200, one_to_many.text
    np.testing.assert_allclose([d["score"] for d in one_to_many.json()["data"]], expected, atol=1e-4, rtol=1e-5)
    queries = [QUERY, "cats and mats", QUERY]
    pairwise = model.similarity_pairwise(model.encode_query(queries), model.encode_document(DOCUMENTS)).numpy()
    many = client.post("/v1/score", json={"queries": queries, "documents": DOCUMENTS})
    assert many.status_code == 200, many.text
    np.testing.assert_allclose([d["score"] for d in many.json()["data"]], pairwise, atol=1e-4, rtol=1e-5)
    cut = client.post("/pooling", json={"input": TEXTS, "dimensions": 4})
    assert cut.status_code == 400 and cut.json()["error"]["param"] == "dimensions", cut.text
    # No single vector to give: refused by name.
    refused = client.post("/v1/embeddings", json={"input": TEXTS})
    assert refused.status_code == 400 and "late-interaction (ColBERT)" in refused.text, refused.text


def assert_same_lexical_weights(served: Entries, reference: list[dict[str, Any]]) -> None:
    """Each served vector has the ids of BGEM3FlagModel's lexical weights (a dict of id strings), values within 1e-4."""
    assert len(served) == len(reference)
    for entries, weights in zip(served, reference, strict=True):
        indices = [entry["index"] for entry in entries]
        assert indices == sorted(int(token_id) for token_id in weights)
        expected = [float(weights[str(index)]) for index in indices]
        np.testing.assert_allclose([entry["value"] for entry in entries], expected, atol=1e-4, rtol=0)


def check_bge_m3(client: httpx.Client, folder: Path) -> None:
    """bge-m3 against BGEM3FlagModel: the dense vector on /v1/embeddings and /embed; the lexical weights on
    /embed_sparse and /pooling (`embed_sparse`); the ColBERT vectors on /pooling (`token_embed`) and /embed_all; and
    /rerank and /score by each output (`output`), the dense vector's cosine by default."""
    model = bge_m3_reference(folder)
    texts = [*TEXTS, LONG]
    reference = model.encode(texts, return_dense=True, return_sparse=True, return_colbert_vecs=True)
    assert_same(embeddings(client, {"input": texts}), reference["dense_vecs"])
    tei = client.post("/embed", json={"inputs": texts, "truncate": True})
    assert tei.status_code == 200, tei.text
    assert_same(np.asarray(tei.json(), dtype=np.float32), reference["dense_vecs"])
    # Lexical weights: the same ids (the unused tokens and weights of 0 left out), values within 1e-4.
    assert_same_lexical_weights(embed_sparse(client, {"inputs": texts}), reference["lexical_weights"])
    pooled = client.post("/pooling", json={"input": texts, "task": "embed_sparse", "truncate_prompt_tokens": -1})
    assert pooled.status_code == 200, pooled.text
    assert_same_lexical_weights([item["data"] for item in pooled.json()["data"]], reference["lexical_weights"])
    top = embed_sparse(client, {"inputs": texts, "sparse_top_k": 3})
    largest = [dict(sorted(weights.items(), key=lambda kv: -kv[1])[:3]) for weights in reference["lexical_weights"]]
    assert_same_lexical_weights(top, largest)
    # ColBERT vectors: every token's but the CLS's, normalized.
    colbert = reference["colbert_vecs"]
    assert_same_tokens(token_vectors(client, "/embed_all", {"inputs": texts, "truncate": True}), colbert)
    body = {"input": texts, "task": "token_embed", "truncate_prompt_tokens": -1}
    assert_same_tokens(token_vectors(client, "/pooling", body), colbert)
    assert_same_tokens(token_vectors(client, "/pooling", {**body, "input_type": "query"}), colbert)
    # Scores, by each output: the dense vectors' dot product (normalized: the cosine), the lexical weights' matching
    # score, and ColBERT's MaxSim over the query's vectors (colbert_score: divided by their count).
    documents = [*DOCUMENTS, LONG]
    query = model.encode_queries([QUERY], return_dense=True, return_sparse=True, return_colbert_vecs=True)
    passages = model.encode_corpus(documents, return_dense=True, return_sparse=True, return_colbert_vecs=True)
    expected = {
        "vector": (query["dense_vecs"] @ passages["dense_vecs"].T)[0].tolist(),
        "sparse": model.compute_lexical_matching_score(query["lexical_weights"], passages["lexical_weights"])[0],
        "multi_vector": [
            float(model.colbert_score(query["colbert_vecs"][0], vectors)) for vectors in passages["colbert_vecs"]
        ],
    }
    for output, scores in expected.items():
        assert_same_scores(served_scores(client, QUERY, documents, truncate_prompt_tokens=-1, output=output), scores)
        tei_ranked = client.post(
            "/rerank", json={"query": QUERY, "texts": documents, "truncate": True, "output": output}
        )
        assert tei_ranked.status_code == 200, tei_ranked.text
        by_index = {item["index"]: item["score"] for item in tei_ranked.json()}
        assert_same_scores([by_index[i] for i in range(len(documents))], scores)
        score = client.post("/score", json={"text_1": QUERY, "text_2": documents, "truncate_prompt_tokens": -1,
                                            "output": output})  # fmt: skip
        assert score.status_code == 200, score.text
        assert_same_scores([item["score"] for item in score.json()["data"]], scores)
    assert_same_scores(served_scores(client, QUERY, documents, truncate_prompt_tokens=-1), expected["vector"])
    # What the model has, where clients look.
    outputs = ["vector", "sparse", "multi_vector"]
    assert client.get("/v1/models").json()["data"][0]["outputs"] == outputs
    assert client.get("/info").json()["outputs"] == outputs
