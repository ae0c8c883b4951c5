"""`launch --plugin` naming a plugin that is not installed stops at start, naming it and the installed ones (the
plugin served: tests/in_process/test_plugins.py)."""

from __future__ import annotations

from bench.harness.server_process import PoolserveProcess


def test_an_unknown_plugin_stops_launch_naming_it_and_the_installed_ones(plugin_path: str) -> None:
    launched = PoolserveProcess("--plugin", "nope", env={"PYTHONPATH": plugin_path})
    try:
        assert launched.wait_exit(30) != 0
        assert "--plugin has value 'nope', which is not an installed plugin; installed: example." in launched.stderr()
    finally:
        launched.stop()
