"""The house's walls, read from the sources: no import circle among the product's modules, bench never imports
tests, and no test module is imported as a library (what several test modules share lives in a module of its own
or a conftest)."""

from __future__ import annotations

import ast
import graphlib
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PRODUCT = ("poolserve", "supervisor", "apiserver", "engine_client", "engine_core", "run_batch")


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


def test_no_module_of_the_product_imports_one_that_imports_it_back() -> None:
    found = modules(*PRODUCT)
    graph = {
        name: {other for other in imported(name, path) if other in found and other != name}
        for name, path in found.items()
    }
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
