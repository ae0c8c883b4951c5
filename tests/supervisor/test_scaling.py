"""SIGTTIN and SIGTTOU change the number of API servers within bounds: one at least, and at most
--max-api-server-count (twice the cores unless set), so a signal storm cannot start a process per signal."""

from __future__ import annotations

import signal

import pytest

from poolserve.config import Config, ConfigError, usable_cores
from supervisor.arbiter import Supervisor


def scale(supervisor: Supervisor, signum: int, times: int) -> None:
    for _ in range(times):  # one at a time: the same signal twice before it is handled counts once
        supervisor.handle_signal(signum, None)
        supervisor._dispatch_signals()


def test_sigttin_scales_up_to_the_ceiling_and_no_further(caplog: pytest.LogCaptureFixture) -> None:
    supervisor = Supervisor(Config(api_server_count=2, max_api_server_count=4))
    scale(supervisor, signal.SIGTTIN, 5)
    assert supervisor.api_server_count == 4
    assert "SIGTTIN ignored: 4 API servers is the maximum (--max-api-server-count)" in caplog.text
    scale(supervisor, signal.SIGTTOU, 5)
    assert supervisor.api_server_count == 1


def test_the_default_ceiling_is_twice_the_cores_or_the_count_given() -> None:
    assert Config(api_server_count=1).api_server_ceiling == max(1, 2 * usable_cores())
    assert Config(api_server_count=64).api_server_ceiling == max(64, 2 * usable_cores())
    with pytest.raises(ConfigError, match="--max-api-server-count has value 2; it must be 0 or at least"):
        Config(api_server_count=3, max_api_server_count=2)
