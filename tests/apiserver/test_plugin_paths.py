"""A plugin may not claim a path the server already serves: not a model route, not /invocations, /metrics or
/openapi.json (each answered by the app itself, beside the endpoint table)."""

from __future__ import annotations

from importlib.metadata import EntryPoint

import pytest

from apiserver import plugins
from apiserver.endpoints import ENDPOINTS, OTHER_PATHS
from apiserver.plugins import Plugin, PluginError, load_plugins
from apiserver.routes.tokenize import TOKENIZE

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
