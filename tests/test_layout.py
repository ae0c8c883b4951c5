"""The house's walls, read from the sources: no import circle among the product's modules, the API server's wings
keep to their layers, bench's harness imports none of its scripts, bench never imports tests, and no test module is
imported as a library (what several test modules share lives in a module of its own or a conftest)."""

from __future__ import annotations

import ast
import graphlib
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PRODUCT = ("poolserve", "supervisor", "apiserver", "engine_client", "engine_core", "run_batch")

# The API server's wings (docs/architecture.md) and what each may not import: the connection layer knows nothing of
# the requests it carries nor of images, the image pipeline nothing of requests or connections, and no wing imports
# the modules that put the process together (its main, the app, the plugin API).
PROCESS = ("apiserver.process", "apiserver.app", "apiserver.plugins", "apiserver.__main__")
WALLS = {
    "apiserver.connection": ("apiserver.requests", "apiserver.images", *PROCESS),
    "apiserver.images": ("apiserver.requests", "apiserver.connection", *PROCESS),
    "apiserver.requests": PROCESS,
}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules(*packages: str) -> dict[str, Path]:
    """The packages' own modules (not the virtualenvs bench and tests keep in dot-folders)."""
    return {
        module_name(path): path
        for package in packages
        for path in sorted((ROOT / package).rglob("*.py"))
        if not any(part.startswith(".") for part in path.relative_to(ROOT).parts)
    }


def imported(name: str, path: Path) -> Iterator[str]:
    """Every module `path` imports, wherever the import stands (a function's, TYPE_CHECKING's), with each
    `from X import Y` also as X.Y (Y may be a module)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                source = ".".join([*base, *([node.module] if node.module else [])])
            else:
                source = node.module or ""
            yield source
            yield from (f"{source}.{alias.name}" for alias in node.names)


def import_graph(*packages: str) -> dict[str, set[str]]:
    """Each module of the packages and the modules of the packages it imports."""
    found = modules(*packages)
    return {
        name: {other for other in imported(name, path) if other in found and other != name}
        for name, path in found.items()
    }


def is_within(name: str, package: str) -> bool:
    return name == package or name.startswith(f"{package}.")


def wall_breaches(graph: dict[str, set[str]]) -> list[str]:
    """Every import of a module in a wing that WALLS forbids it."""
    return sorted(
        f"{name} imports {other}"
        for wing, forbidden in WALLS.items()
        for name, others in graph.items()
        if is_within(name, wing)
        for other in others
        if any(is_within(other, walled) for walled in forbidden)
    )


def test_no_module_of_the_product_imports_one_that_imports_it_back() -> None:
    graph = import_graph(*PRODUCT)
    try:
        list(graphlib.TopologicalSorter(graph).static_order())
    except graphlib.CycleError as exc:
        raise AssertionError(f"an import circle: {' -> '.join(exc.args[1])}") from exc


def test_the_check_sees_a_circle() -> None:
    """The check above can fail: two modules that import each other are a CycleError."""
    graph = {"a": {"b"}, "b": {"a"}}
    try:
        list(graphlib.TopologicalSorter(graph).static_order())
    except graphlib.CycleError:
        return
    raise AssertionError("no circle seen")


def test_the_api_servers_wings_import_nothing_across_their_walls() -> None:
    graph = import_graph("apiserver")
    assert {wing for wing in WALLS if any(is_within(name, wing) for name in graph)} == set(WALLS)
    assert wall_breaches(graph) == []


def test_the_wall_check_sees_a_breach() -> None:
    """The check above can fail: the connection layer importing the request layer, or the images the process's
    main, is a breach; the request layer importing the connection layer is not."""
    graph = {
        "apiserver.connection.gate": {"apiserver.requests.request_cycle", "apiserver.errors"},
        "apiserver.images.sources": {"apiserver.process"},
        "apiserver.requests.request_cycle": {"apiserver.connection.gate"},
    }
    assert wall_breaches(graph) == [
        "apiserver.connection.gate imports apiserver.requests.request_cycle",
        "apiserver.images.sources imports apiserver.process",
    ]


def test_the_bench_harness_imports_none_of_the_bench_scripts() -> None:
    """bench/harness is what the scripts and the tests share; a script is run, never a library of the harness."""
    found = modules("bench")
    offending = [
        f"{name} imports {other}"
        for name, path in found.items()
        if is_within(name, "bench.harness")
        for other in imported(name, path)
        if other in found and other != "bench" and not is_within(other, "bench.harness")
    ]
    assert any(is_within(name, "bench.harness") for name in found)
    assert offending == []


def test_bench_never_imports_tests() -> None:
    offending = [
        f"{name} imports {other}"
        for name, path in modules("bench").items()
        for other in imported(name, path)
        if other == "tests" or other.startswith("tests.")
    ]
    assert offending == []


def test_no_test_module_is_imported_as_a_library() -> None:
    offending = [
        f"{name} imports {other}"
        for name, path in modules("tests", "bench").items()
        for other in imported(name, path)
        if other.rpartition(".")[2].startswith("test_") and other.startswith("tests.")
    ]
    assert offending == []
