"""Markdown tables over a sweep's results: the results' type, picking runs, formatting figures."""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

Results = dict[str, Any]


def fmt(value: Any, digits: int = 1) -> str:
    if value is None:
        return "—"
    if isinstance(value, float):
        if math.isnan(value):
            return "—"
        return f"{value:,.{digits}f}"
    return str(value)


def table(header: list[str], rows: Iterable[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def runs_of(results: Results, workload: str, target: str | None = None) -> list[dict[str, Any]]:
    return [
        run
        for run in results.get("runs", [])
        if run["workload"] == workload and (target is None or run.get("target") == target)
    ]
