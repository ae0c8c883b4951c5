"""The API layer's fixtures: `serve` (the real app over an in-process engine, tests/apiserver/test_request_cycle.py)
for every module of this folder; `hf_tokenizer`, a Qwen-style BPE tokenizer (bench/llm_reranker.py) for the LLM
rerankers' prompt readers (tests/utils.py's `reranker_card` makes a card over it)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from bench.llm_reranker import bpe_tokenizer
from tests.apiserver.test_request_cycle import serve

__all__ = ["hf_tokenizer", "serve"]


@pytest.fixture(scope="module")
def hf_tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Any:
    folder: Path = tmp_path_factory.mktemp("bpe")
    return bpe_tokenizer(folder)
