"""IO-processor plugins: endpoints that installed packages add through the `poolserve.plugins` entry point.

A plugin is an Operation (its request type, parse and render, as every built-in endpoint has) and
the path it answers on; `launch --plugin NAME` serves it through the same request cycle, limits,
metrics and /openapi.json as the built-in endpoints (docs/api.md, "Plugins").
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from importlib.metadata import entry_points
from typing import Any

from apiserver.errors import ApiError, bad_request
from apiserver.requests.endpoints import ENDPOINTS, OTHER_PATHS, Endpoint
from apiserver.requests.inputs.job import EngineJob
from apiserver.requests.inputs.text import tokenize_texts
from apiserver.requests.limits import check_input_count
from apiserver.requests.operation import AnyOperation, Operation, Plan, Rows
from apiserver.requests.responses import encode_json
from apiserver.requests.state import AppState
from poolserve.config import PLUGIN_GROUP
from poolserve.protocol import PoolingParams

# What a plugin module imports, all from here: the endpoint's shape, the engine job and its params, the checks and
# errors every endpoint uses, and the server state parse and render are given.
__all__ = [
    "ApiError",
    "AppState",
    "EngineJob",
    "Operation",
    "Plan",
    "Plugin",
    "PoolingParams",
    "Rows",
    "bad_request",
    "check_input_count",
    "encode_json",
    "tokenize_texts",
]


@dataclass(frozen=True, slots=True)
class Plugin:
    """What a plugin's entry point names. `response`: the msgspec type of a 200 answer, for /openapi.json."""

    path: str
    operation: AnyOperation
    summary: str
    response: Any = None


logger = logging.getLogger("poolserve.api")

# A plugin import taking longer than this is logged as still loading.
SLOW_LOAD_S = 5.0


class PluginError(Exception):
    """A plugin that cannot be served; the message names it and says why."""


def load_plugins(names: list[str]) -> list[Endpoint]:
    """The endpoints of the named plugins (Config checked the names are installed), tagged by plugin."""
    found = {entry.name: entry for entry in entry_points(group=PLUGIN_GROUP)}
    taken = {endpoint.path for endpoint in ENDPOINTS} | OTHER_PATHS
    endpoints = []
    for name in names:
        logger.info("loading the plugin %r (%s)", name, found[name].value)
        # A plugin whose import hangs would hold the boot until its timeout with nothing said: named meanwhile.
        still_loading = threading.Timer(
            SLOW_LOAD_S, logger.warning, ("the plugin %r is still loading after %.0fs", name, SLOW_LOAD_S)
        )
        still_loading.start()
        try:
            plugin = found[name].load()
        except BaseException as exc:  # SystemExit too: a plugin that exits at import is named, not the process's exit
            raise PluginError(f"The plugin {name!r} ({found[name].value}) failed to load: {exc!r}.") from exc
        finally:
            still_loading.cancel()
        if not isinstance(plugin, Plugin) or not isinstance(plugin.operation, Operation):
            raise PluginError(f"The plugin {name!r} names {plugin!r}, not an apiserver.plugins.Plugin.")
        if not plugin.path.startswith("/") or plugin.path in taken:
            raise PluginError(f"The plugin {name!r} asks for the path {plugin.path!r}, which is taken or not a path.")
        taken.add(plugin.path)
        endpoints.append(
            Endpoint(plugin.path, "POST", plugin.summary, f"plugin {name}", plugin.response, plugin.operation)
        )
    return endpoints
