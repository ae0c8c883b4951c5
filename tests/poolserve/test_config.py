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
