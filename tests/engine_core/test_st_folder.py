"""What engine_core/st_folder.py reads from a folder's Sentence-Transformers files, and each refusal's sentence
that tests/fidelity does not build a whole model for."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from engine_core.st_folder import read_st_folder
from engine_core.st_modules import (
    DenseHead,
    LateInteractionFolder,
    MetadataError,
    NormalizeHead,
    SpladeOptions,
    StFolder,
)

TRANSFORMER = {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"}
POOLING = {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}


def write(folder: Path, modules: list[dict[str, Any]], files: dict[str, Any]) -> Path:
    (folder / "modules.json").write_text(json.dumps(modules))
    for name, content in files.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(json.dumps(content))
    return folder


def test_the_bundled_model_is_mean_pooled_normalized_at_256(bundled_model: Path) -> None:
    st = read_st_folder(bundled_model)
    assert (st.pooling, st.normalize, st.max_seq_length, st.heads) == (("mean",), True, 256, ())
    assert st.prompts == {"query": "", "document": ""} and st.similarity == "cosine"


def test_a_folder_without_sentence_transformers_files_says_nothing(tmp_path: Path) -> None:
    assert read_st_folder(tmp_path) == StFolder()


def test_a_normalize_between_heads_runs_as_a_head_and_only_a_trailing_one_is_the_models(tmp_path: Path) -> None:
    dense = {"in_features": 4, "out_features": 2, "activation_function": "torch.nn.modules.linear.Identity"}
    modules = [
        TRANSFORMER, POOLING,
        {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"},
        {"idx": 3, "name": "3", "path": "3_Dense", "type": "sentence_transformers.models.Dense"},
    ]  # fmt: skip
    st = read_st_folder(write(tmp_path, modules, {"1_Pooling/config.json": {}, "3_Dense/config.json": dense}))
    assert st.pooling == ("mean",)  # no mode set: sentence-transformers' default
    assert st.heads == (NormalizeHead(), DenseHead(tmp_path / "3_Dense", 4, 2, True, dense["activation_function"]))
    assert st.normalize is False


@pytest.mark.parametrize(
    ("files", "sentence"),
    [
        (
            {"sentence_bert_config.json": {"transformer_task": "fill-mask"}},
            "a Transformer with transformer_task 'fill-mask' (an MLM head) is served in a SparseEncoder followed by "
            "SpladePooling, not here",
        ),
        (
            {"sentence_bert_config.json": {"transformer_task": "text-generation"}},
            "a Transformer with transformer_task 'text-generation' is served in a CrossEncoder only (an LLM reranker)",
        ),
        (
            {
                "config_sentence_transformers.json": {"model_type": "CrossEncoder"},
                "sentence_bert_config.json": {"transformer_task": "text-generation"},
            },
            "this CrossEncoder's language model is followed by module 1_Pooling "
            "(sentence_transformers.models.Pooling); poolserve needs one LogitScore",
        ),
        (
            {"sentence_bert_config.json": {"modality_config": {"text": {}, "image": {}}}},
            "a Transformer reading ['image', 'text'] (modality_config) is not supported",
        ),
        (
            {"sentence_bert_config.json": {"backend": "onnx"}},
            "sentence_bert_config.json asks for the 'onnx' backend; poolserve runs torch",
        ),
        (
            {"config_sentence_transformers.json": {"model_type": "MultiVectorEncoder"}},
            "this MultiVectorEncoder has 0 MultiVectorMask modules; poolserve runs one",
        ),
        (
            {"config_sentence_transformers.json": {"prompts": {"query": "q: "}, "default_prompt_name": "passage"}},
            "default_prompt_name 'passage' is not one of the prompts ['document', 'query']",
        ),
        (
            {"config_sentence_transformers.json": {"similarity_fn_name": "cosine_squared"}},
            "similarity_fn_name 'cosine_squared' is not one of cosine, dot, euclidean, manhattan",
        ),
        (
            {"1_Pooling/config.json": {"pooling_mode": "attention"}},
            "pooling mode ['attention'] is not one of cls, max, mean, mean_sqrt_len_tokens, weightedmean, lasttoken",
        ),
    ],
)
def test_what_poolserve_cannot_run_exactly_is_refused_in_one_sentence(
    tmp_path: Path, files: dict[str, Any], sentence: str
) -> None:
    with pytest.raises(MetadataError) as refused:
        read_st_folder(write(tmp_path, [TRANSFORMER, POOLING], {"1_Pooling/config.json": {}, **files}))
    assert str(refused.value) == sentence


def test_a_cross_encoder_with_prompts_is_refused(tmp_path: Path) -> None:
    settings = {"model_type": "CrossEncoder", "prompts": {"query": "q: "}}
    with pytest.raises(MetadataError, match="prompts on a CrossEncoder are not supported yet"):
        read_st_folder(write(tmp_path, [TRANSFORMER], {"config_sentence_transformers.json": settings}))


MLM = {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.sparse_encoder.modules.MLMTransformer"}
SPLADE = {
    "idx": 1,
    "name": "1",
    "path": "1_SpladePooling",
    "type": "sentence_transformers.sparse_encoder.modules.SpladePooling",
}
SPARSE_SETTINGS = {"model_type": "SparseEncoder", "similarity_fn_name": None}


def test_a_sparse_encoder_is_read_with_its_pooling_its_cap_and_the_dot_product(tmp_path: Path) -> None:
    """sentence-transformers 5's layout: MLMTransformer, SpladePooling's old width key, max_active_dims."""
    pooling = {"pooling_strategy": "sum", "activation_function": "log1p_relu", "word_embedding_dimension": 30522}
    settings = {**SPARSE_SETTINGS, "max_active_dims": 64}
    files = {"1_SpladePooling/config.json": pooling, "config_sentence_transformers.json": settings,
             "sentence_bert_config.json": {"max_seq_length": 256, "do_lower_case": False}}  # fmt: skip
    st = read_st_folder(write(tmp_path, [MLM, SPLADE], files))
    assert st.splade == SpladeOptions("sum", "log1p_relu") and st.max_active_dims == 64
    assert (st.similarity, st.max_seq_length, st.pooling, st.heads) == ("dot", 256, (), ())


@pytest.mark.parametrize(
    ("modules", "files", "sentence"),
    [
        (
            [{**MLM, "type": "sentence_transformers.base.modules.transformer.Transformer"}, SPLADE],
            {},
            "this SparseEncoder's Transformer has no transformer_task 'fill-mask' (no MLM head)",
        ),
        (
            [MLM, POOLING],
            {"1_Pooling/config.json": {}},
            "the SparseEncoder's Transformer is followed by module 1_Pooling (sentence_transformers.models.Pooling); "
            "poolserve needs SpladePooling next",
        ),
        (
            [
                MLM,
                SPLADE,
                {**POOLING, "idx": 2, "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"},
            ],
            {},
            "this SparseEncoder has modules after its SpladePooling (module 2_Normalize "
            "(sentence_transformers.models.Normalize))",
        ),
        (
            [MLM, SPLADE],
            {"1_SpladePooling/config.json": {"pooling_strategy": "mean"}},
            "SpladePooling's pooling_strategy 'mean' is not max or sum",
        ),
        (
            [MLM, SPLADE],
            {"1_SpladePooling/config.json": {"activation_function": "gelu"}},
            "SpladePooling's activation_function 'gelu' is not relu or log1p_relu",
        ),
        (
            [MLM, SPLADE],
            {"1_SpladePooling/config.json": {"include_prompt": False}},
            "the module 1_SpladePooling (sentence_transformers.sparse_encoder.modules.SpladePooling) sets "
            "['include_prompt'], which poolserve does not apply",
        ),
        (
            [MLM, SPLADE],
            {"config_sentence_transformers.json": {**SPARSE_SETTINGS, "max_active_dims": 0}},
            "max_active_dims 0 is not a positive integer",
        ),
    ],
)
def test_what_poolserve_cannot_run_of_a_sparse_encoder_is_refused_in_one_sentence(
    tmp_path: Path, modules: list[dict[str, Any]], files: dict[str, Any], sentence: str
) -> None:
    files = {"1_SpladePooling/config.json": {}, "config_sentence_transformers.json": SPARSE_SETTINGS, **files}
    with pytest.raises(MetadataError) as refused:
        read_st_folder(write(tmp_path, modules, files))
    assert str(refused.value) == sentence


MVE_TRANSFORMER = {
    "idx": 0,
    "name": "0",
    "path": "",
    "type": "sentence_transformers.base.modules.transformer.Transformer",
}
TOKEN_DENSE = {"idx": 1, "name": "1", "path": "1_Dense", "type": "sentence_transformers.base.modules.dense.Dense"}
MASK = {
    "idx": 2, "name": "2", "path": "2_MultiVectorMask",
    "type": "sentence_transformers.multi_vector_encoder.modules.multi_vector_mask.MultiVectorMask",
}  # fmt: skip
TOKEN_NORMALIZE = {
    "idx": 3,
    "name": "3",
    "path": "3_Normalize",
    "type": "sentence_transformers.base.modules.normalize.Normalize",
}
ON_TOKENS = {"module_input_name": "token_embeddings", "module_output_name": "token_embeddings"}
DENSE_ON_TOKENS = {
    "in_features": 4,
    "out_features": 2,
    "bias": False,
    "activation_function": "torch.nn.modules.linear.Identity",
    **ON_TOKENS,
}


def multi_vector_files(**changes: Any) -> dict[str, Any]:
    files: dict[str, Any] = {
        "config_sentence_transformers.json": {"model_type": "MultiVectorEncoder", "prompts": {"query": "[Q] "}},
        "sentence_bert_config.json": {
            "module_output_name": "token_embeddings", "document_length": 40,
            "query_expansion": {"strategy": "fixed", "attend": False, "token": None, "length": 12},
        },
        "1_Dense/config.json": DENSE_ON_TOKENS,
        "2_MultiVectorMask/config.json": {"skiplist_words": [".", "!"], "skiplist_tasks": ["document"],
                                          "keep_only_token_ids": None},
        "3_Normalize/config.json": ON_TOKENS,
    }  # fmt: skip
    for name, change in changes.items():
        files[name] = {**files[name], **change}
    return files


def test_a_multi_vector_encoder_reads_its_token_heads_roles_and_skiplist(tmp_path: Path) -> None:
    modules = [MVE_TRANSFORMER, TOKEN_DENSE, MASK, TOKEN_NORMALIZE]
    st = read_st_folder(write(tmp_path, modules, multi_vector_files()))
    assert st.heads == (DenseHead(tmp_path / "1_Dense", 4, 2, False, DENSE_ON_TOKENS["activation_function"]),)
    assert st.normalize is True and st.prompts == {"query": "[Q] ", "document": ""}
    assert st.late_interaction == LateInteractionFolder(
        document_length=40, expansion=12, expansion_is_fixed=True, skiplist_words=(".", "!")
    )


@pytest.mark.parametrize(
    ("modules", "changes", "sentence"),
    [
        (
            [MVE_TRANSFORMER, TOKEN_DENSE, MASK],
            {"2_MultiVectorMask/config.json": {"skiplist_tasks": ["query", "document"]}},
            "the module 2_MultiVectorMask (sentence_transformers.multi_vector_encoder.modules.multi_vector_mask."
            "MultiVectorMask) applies its skiplist to ['query', 'document']; poolserve applies one to documents only "
            "(sentence-transformers' default)",
        ),
        (
            [MVE_TRANSFORMER, TOKEN_DENSE, MASK],
            {"2_MultiVectorMask/config.json": {"keep_only_token_ids": [7]}},
            "the module 2_MultiVectorMask (sentence_transformers.multi_vector_encoder.modules.multi_vector_mask."
            "MultiVectorMask) keeps only some token ids (keep_only_token_ids), which poolserve does not apply",
        ),
        (
            [MVE_TRANSFORMER, TOKEN_DENSE, MASK],
            {"1_Dense/config.json": {"module_input_name": "sentence_embedding"}},
            "the module 1_Dense (sentence_transformers.base.modules.dense.Dense) works on 'sentence_embedding'; a "
            "MultiVectorEncoder's modules work on 'token_embeddings', the only kind poolserve runs there",
        ),
        (
            [MVE_TRANSFORMER, TOKEN_DENSE, MASK],
            {"sentence_bert_config.json": {"query_expansion": {"strategy": "fixed", "length": 12}, "query_length": 8}},
            "query_length 8 is below the query_expansion length 12",
        ),
        (
            [MVE_TRANSFORMER, TOKEN_DENSE, MASK],
            {"config_sentence_transformers.json": {"similarity_fn_name": "cosine"}},
            "similarity_fn_name 'cosine' is not one of maxsim, meanmaxsim",
        ),
    ],
)
def test_what_a_multi_vector_encoder_asks_beyond_poolserve_is_refused_in_one_sentence(
    tmp_path: Path, modules: list[dict[str, Any]], changes: dict[str, Any], sentence: str
) -> None:
    with pytest.raises(MetadataError) as refused:
        read_st_folder(write(tmp_path, modules, multi_vector_files(**changes)))
    assert str(refused.value) == sentence


@pytest.mark.parametrize(
    ("settings", "dense_type"),
    [
        ({"query_prefix": "[Q] ", "document_prefix": "[D] ", "query_length": 32}, "sentence_transformers.models.Dense"),
        ({}, "pylate.models.Dense.Dense"),
    ],
)
def test_a_pylate_save_under_another_model_type_than_colbert_is_refused_by_name(
    tmp_path: Path, settings: dict[str, Any], dense_type: str
) -> None:
    modules = [TRANSFORMER, {"idx": 1, "name": "1", "path": "1_Dense", "type": dense_type}]
    files = {"config_sentence_transformers.json": {"model_type": "SentenceTransformer", **settings}}
    with pytest.raises(MetadataError, match="PyLate's settings or modules under model_type 'SentenceTransformer'"):
        read_st_folder(write(tmp_path, modules, files))


ROUTER = {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.base.modules.router.Router"}
CHAIN_TYPES = {
    "q_0": "sentence_transformers.base.modules.transformer.Transformer",
    "q_1": "sentence_transformers.sentence_transformer.modules.pooling.Pooling",
    "d_0": "sentence_transformers.base.modules.transformer.Transformer",
    "d_1": "sentence_transformers.sentence_transformer.modules.pooling.Pooling",
}


def router_folder(folder: Path, structure: dict[str, list[str]], **parameters: Any) -> Path:
    config = {"types": CHAIN_TYPES, "structure": structure, "parameters": parameters}
    files = {"router_config.json": config, "q_1/config.json": {"pooling_mode": "mean"},
             "d_1/config.json": {"pooling_mode": "cls"}}  # fmt: skip
    return write(folder, [ROUTER], files)


def test_a_router_resolves_its_routes_as_sentence_transformers_does(tmp_path: Path) -> None:
    # A route named as the task; texts with no task take the first route (allow_empty_key, no default_route).
    st = read_st_folder(router_folder(tmp_path, {"query": ["q_0", "q_1"], "document": ["d_0", "d_1"]}))
    assert st.router is not None and st.router.default == "query" and st.router.names == ("query", "document")
    assert (st.router.query.transformer_folder, st.router.query.pooling) == (tmp_path / "q_0", ("mean",))
    assert (st.router.document.transformer_folder, st.router.document.pooling) == (tmp_path / "d_0", ("cls",))
    # route_mappings by (task, modality) first, as the Router reads them back from their string keys.
    mapped = {"('query', None)": "d", "(None, 'text')": "q"}
    st = read_st_folder(router_folder(tmp_path, {"q": ["q_0", "q_1"], "d": ["d_0", "d_1"]}, route_mappings=mapped))
    assert st.router is not None and st.router.names == ("d", "q") and st.router.default == "document"
    # One route for every text: served as that chain, with no Router at all.
    st = read_st_folder(router_folder(tmp_path, {"text": ["q_0", "q_1"]}))
    assert st.router is None and st.pooling == ("mean",)


@pytest.mark.parametrize(
    ("structure", "parameters", "sentence"),
    [
        (
            {"q": ["q_0", "q_1"], "d": ["d_0", "d_1"]},
            {"default_route": "d"},
            "has no route for task 'query', so sentence-transformers cannot encode such a text",
        ),
        (
            {"query": ["q_0", "q_1"], "document": ["d_0", "d_1"]},
            {"default_route": None, "allow_empty_key": False},
            "has no route for a text with no task",
        ),
        (
            {"query": ["q_0", "q_1"], "document": ["d_0", "d_1"], "image": ["d_0"]},
            {"default_route": "document"},
            "the Router's route 'image' is taken by no text",
        ),
        (
            {"query": ["q_0", "q_1"], "document": ["d_0", "d_1"], "general": ["d_0", "d_1"]},
            {"default_route": "general"},
            "sends a text with no task down route 'general', neither the query's ('query') nor the document's",
        ),
        (
            {"query": ["q_0"], "document": ["d_0", "d_1"]},
            {},
            "the Router's route 'query': the Transformer module is followed by nothing",
        ),
        ({"query": ["q_0", "q_1"], "document": ["d_0", "d_1"]}, {"shuffle": True}, "sets ['shuffle']"),
    ],
)
def test_what_poolserve_cannot_route_is_refused_in_one_sentence(
    tmp_path: Path, structure: dict[str, list[str]], parameters: dict[str, Any], sentence: str
) -> None:
    with pytest.raises(MetadataError, match=re.escape(sentence)):
        read_st_folder(router_folder(tmp_path, structure, **parameters))


def test_a_router_after_other_modules_is_refused(tmp_path: Path) -> None:
    asym = {"idx": 2, "name": "2", "path": "2_Asym", "type": "sentence_transformers.models.Asym"}
    with pytest.raises(MetadataError, match="is served first in a SentenceTransformer or a SparseEncoder"):
        read_st_folder(write(tmp_path, [TRANSFORMER, POOLING, asym], {"1_Pooling/config.json": {}}))
