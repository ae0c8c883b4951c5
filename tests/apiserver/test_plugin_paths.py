"""A plugin may not claim a path the server already serves: not a model route, not /invocations, /metrics or
/openapi.json (each answered by the app itself, beside the endpoint table)."""

from __future__ import annotations

import logging
import time
from importlib.metadata import EntryPoint

import pytest

from apiserver import plugins
from apiserver.plugins import Plugin, PluginError, load_plugins
from apiserver.requests.endpoints import ENDPOINTS, OTHER_PATHS
from apiserver.requests.routes.tokenize import TOKENIZE

PLUGINS = {path: Plugin(path, TOKENIZE, "claims a path") for path in ["/mine", *sorted(OTHER_PATHS), "/v1/embeddings"]}


@pytest.mark.parametrize("path", [*sorted(OTHER_PATHS), "/v1/embeddings"])
def test_a_plugin_on_a_path_the_server_serves_is_refused_at_start(path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    entry = EntryPoint("claims", f"{__name__}:PLUGINS", plugins.PLUGIN_GROUP)
    monkeypatch.setattr(plugins, "entry_points", lambda group: [entry])
    monkeypatch.setattr(EntryPoint, "load", lambda self: PLUGINS[path])
    with pytest.raises(PluginError, match="which is taken"):
        load_plugins(["claims"])


def test_a_plugin_on_a_free_path_is_served(monkeypatch: pytest.MonkeyPatch) -> None:
    entry = EntryPoint("mine", f"{__name__}:PLUGINS", plugins.PLUGIN_GROUP)
    monkeypatch.setattr(plugins, "entry_points", lambda group: [entry])
    monkeypatch.setattr(EntryPoint, "load", lambda self: PLUGINS["/mine"])
    [endpoint] = load_plugins(["mine"])
    assert endpoint.path == "/mine" and endpoint.path not in {e.path for e in ENDPOINTS}


@pytest.mark.parametrize("failure", [SystemExit(3), ImportError("no module named torch_extras")])
def test_a_plugin_that_fails_or_exits_at_import_is_named(
    failure: BaseException, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its error names it, where an exit at import used to end the API server with no word of which plugin."""
    entry = EntryPoint("broken", f"{__name__}:PLUGINS", plugins.PLUGIN_GROUP)
    monkeypatch.setattr(plugins, "entry_points", lambda group: [entry])

    def load(self: EntryPoint) -> Plugin:
        raise failure

    monkeypatch.setattr(EntryPoint, "load", load)
    with pytest.raises(
        PluginError, match=r"The plugin 'broken' \(tests\.apiserver\.test_plugin_paths:PLUGINS\) failed"
    ):
        load_plugins(["broken"])


def test_a_plugin_whose_import_hangs_is_named_while_it_loads(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    entry = EntryPoint("slow", f"{__name__}:PLUGINS", plugins.PLUGIN_GROUP)
    monkeypatch.setattr(plugins, "entry_points", lambda group: [entry])
    monkeypatch.setattr(plugins, "SLOW_LOAD_S", 0.05)

    def load(self: EntryPoint) -> Plugin:
        time.sleep(0.3)
        return PLUGINS["/mine"]

    monkeypatch.setattr(EntryPoint, "load", load)
    with caplog.at_level(logging.INFO, logger="poolserve.api"):
        load_plugins(["slow"])
    assert "loading the plugin 'slow'" in caplog.text
    assert "the plugin 'slow' is still loading after 0s" in caplog.text
