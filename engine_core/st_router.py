"""sentence-transformers' Router (`Asym` before version 5): separate query and document paths, chosen by a text's
task.

`encode_query` runs a text through the route task "query" resolves to, `encode_document` through task
"document"'s, and `encode` (no task) through the default, each resolved as `Router._resolve_route` resolves a
text's: `route_mappings` by (task, modality) first, then a route named as the task, then one named "text", then
`default_route` (the first route when that is unset and `allow_empty_key`). poolserve serves a Router first in a
SentenceTransformer whose routes are each a Transformer, a Pooling and heads (the modules after the Router closing
every route), the texts with no task taking the query's or the document's route; anything else is refused by name.
The routes' chains are read by engine_core/st_chain.py and loaded by engine_core/router.py.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from engine_core.st_chain import read_embedding_chain
from engine_core.st_modules import (
    SENTENCE_TRANSFORMER,
    MetadataError,
    RouterFolder,
    StFolder,
    describe,
    module_class,
    read_json,
)

ROUTER_MODULES = {"Router", "Asym"}
ROUTER_PARAMETERS = {"default_route", "allow_empty_key", "route_mappings"}
# The modality a string is (sentence_transformers' infer_modality): the only one poolserve's Router texts have.
TEXT = "text"
Mappings = dict[tuple[str | None, str | tuple[str, ...] | None], str]


@dataclass(frozen=True, slots=True)
class Routes:
    """A Router's routes resolved for texts: each route's modules (paths within the model's folder), the route a query
    and a document take, and the role whose route a text with no task takes."""

    modules: dict[str, list[dict[str, Any]]]
    query: str
    document: str
    default: str


def read_routes(folder: Path, module: dict[str, Any]) -> Routes:
    """The Router's routes as `Router.load` reads them (router_config.json, else an Asym's config.json), resolved
    for a text with task "query", "document" and none, as `Router._resolve_route` resolves them."""
    path = PurePosixPath(str(module.get("path", "")))
    config_path = folder / str(path) / "router_config.json"
    if not config_path.is_file():  # sentence-transformers 2-4 saved an Asym's as config.json
        config_path = folder / str(path) / "config.json"
    config: dict[str, Any] = read_json(config_path)
    types: dict[str, str] = config.get("types") or {}
    structure: dict[str, list[str]] = config.get("structure") or {}
    parameters: dict[str, Any] = config.get("parameters") or {}
    unknown = sorted(set(parameters) - ROUTER_PARAMETERS)
    if unknown:
        raise MetadataError(f"the {describe(module)} sets {unknown}, which poolserve does not apply")
    if not structure:
        raise MetadataError(f"the {describe(module)} has no routes")
    routes = {
        name: [{"path": str(path / model_id), "name": model_id, "type": types.get(model_id, "")} for model_id in ids]
        for name, ids in structure.items()
    }
    for name, chain in routes.items():
        for sub in chain:
            if not module_class(sub):
                raise MetadataError(
                    f"the Router's route {name!r} runs {describe(sub)}, custom code, not one of sentence-transformers' "
                    "own modules, which are all poolserve runs"
                )
    mappings = read_mappings(parameters.get("route_mappings") or {})
    default = parameters.get("default_route")
    if default is None and parameters.get("allow_empty_key", True):
        default = next(iter(routes))
    query = resolve_route("query", mappings, routes, default)
    document = resolve_route("document", mappings, routes, default)
    neither = resolve_route(None, mappings, routes, default)
    for task, route in (("query", query), ("document", document), (None, neither)):
        if route is None:
            said = "a text with no task" if task is None else f"task {task!r}"
            raise MetadataError(f"the {describe(module)} has no route for {said}, so sentence-transformers cannot "
                                "encode such a text")  # fmt: skip
    assert query is not None and document is not None and neither is not None
    untaken = [name for name in routes if name not in (query, document, neither)]
    if untaken:
        raise MetadataError(
            f"the Router's route {untaken[0]!r} is taken by no text (a route by modality or by another task), "
            "which poolserve does not serve"
        )
    if neither not in (query, document):
        raise MetadataError(
            f"the Router sends a text with no task down route {neither!r}, neither the query's ({query!r}) nor the "
            f"document's ({document!r}); poolserve serves a query path and a document path"
        )
    return Routes(routes, query, document, "query" if neither == query else "document")


def read_router(folder: Path, module: dict[str, Any], rest: list[dict[str, Any]], **settings: Any) -> StFolder:
    """A Router first in a SentenceTransformer, the modules after it (`rest`) closing each of its routes."""
    routes = read_routes(folder, module)
    query, document = routes.query, routes.document
    chains = {name: read_route(folder, name, routes.modules[name] + rest, settings) for name in {query, document}}
    if query == document:  # one path for every text: not asymmetric at all
        return chains[query]
    first, second = chains[query], chains[document]
    if first.pooling_includes_prompt != second.pooling_includes_prompt:
        raise MetadataError("the Router's routes differ in whether their Pooling leaves the prompt out "
                            "(include_prompt), which poolserve does not serve")  # fmt: skip
    if first.normalize != second.normalize:
        raise MetadataError("one of the Router's routes ends with a Normalize and the other does not, which "
                            "poolserve does not serve")  # fmt: skip
    return StFolder(
        has_modules=True, model_type=SENTENCE_TRANSFORMER, normalize=first.normalize,
        pooling_includes_prompt=first.pooling_includes_prompt,
        router=RouterFolder(first, second, routes.default, (query, document)), **settings,
    )  # fmt: skip


def read_route(folder: Path, name: str, modules: list[dict[str, Any]], settings: dict[str, Any]) -> StFolder:
    if module_class(modules[0]) != "Transformer":
        raise MetadataError(
            f"the Router's route {name!r} begins with {describe(modules[0])}; poolserve serves routes that are each a "
            "Transformer, a Pooling and heads"
        )
    try:
        chain = read_embedding_chain(folder, modules, **settings)
    except MetadataError as exc:
        raise MetadataError(f"the Router's route {name!r}: {exc}") from exc
    if chain.renders_messages:
        raise MetadataError(f"the Router's route {name!r} renders its texts through a chat template (modality_config "
                            "'message'), which poolserve does not serve in a Router")  # fmt: skip
    return chain


def read_mappings(saved: dict[str, str]) -> Mappings:
    """`route_mappings` as the Router reads them back: keys are tuples written as strings; a key that does not parse
    is skipped (with a warning, in sentence-transformers); a tuple modality is sorted."""
    mappings: Mappings = {}
    for key, route in saved.items():
        try:
            task, modality = ast.literal_eval(key)
        except (ValueError, SyntaxError, TypeError):
            continue
        mappings[(task, tuple(sorted(modality)) if isinstance(modality, tuple) else modality)] = str(route)
    return mappings


def resolve_route(task: str | None, mappings: Mappings, routes: dict[str, Any], default: str | None) -> str | None:
    """The route of a text with this task, as Router._resolve_route resolves it; None where it raises."""
    for key in ((task, TEXT), (task, None), (None, TEXT), (None, None)):
        if key in mappings:
            return mappings[key]
    if task and task in routes:
        return task
    if TEXT in routes:
        return TEXT
    if task is not None:
        return None  # "No route found for task type ..."
    return default if default in routes else None
