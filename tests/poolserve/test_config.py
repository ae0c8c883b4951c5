"""Config checks that depend on the machine: the connection limit against the file-descriptor limit."""

from __future__ import annotations

import resource

import pytest

from poolserve.config import FDS_RESERVED_PER_SERVER, Config, ConfigError, check_connection_limit, open_files_limit


def test_the_connection_limit_must_leave_the_server_its_own_files() -> None:
    check_connection_limit(1024 - FDS_RESERVED_PER_SERVER, 1024)
    with pytest.raises(ConfigError, match=r"^--max-connections-per-server has value 1000, .* give at most 896, "):
        check_connection_limit(1000, 1024)
    with pytest.raises(ConfigError, match="--max-connections-per-server has value 0"):
        check_connection_limit(0, 1024)
    check_connection_limit(10**9, 0)  # no file limit at all


def test_the_default_connection_limit_fits_the_common_default_file_limit_of_1024() -> None:
    check_connection_limit(Config().max_connections_per_server, 1024)


def test_the_limit_read_is_this_process_s_soft_limit() -> None:
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    assert open_files_limit() == (0 if soft == resource.RLIM_INFINITY else soft)
    if soft == resource.RLIM_INFINITY:
        pytest.skip("this process has no file-descriptor limit")
    with pytest.raises(ConfigError, match="ulimit -n"):
        Config(max_connections_per_server=open_files_limit())


def test_a_score_format_takes_neither_score_tokens_nor_a_score_template() -> None:
    Config(score_format="mxbai-rerank-v2")
    with pytest.raises(ConfigError, match=r"^--score-format mxbai-rerank-v2 says the prompt and the score tokens"):
        Config(score_format="mxbai-rerank-v2", score_tokens=["1", "0"])
    with pytest.raises(ConfigError, match="drop --score-tokens and --score-template"):
        Config(score_format="bge-reranker-v2-gemma", score_template="t.jinja")


def test_int8_is_a_cpu_mode() -> None:
    assert Config(dtype="int8").dtype == "int8"
    with pytest.raises(ConfigError, match=r"^--dtype int8 is a CPU mode; with --device cuda"):
        Config(dtype="int8", device="cuda")
