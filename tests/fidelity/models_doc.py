"""docs/models.md's rows, by layout id."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ROW = re.compile(r"^\| `([a-z0-9-]+)`(?: \(refused\))? \|(.*)$", re.MULTILINE)


def documented_rows() -> dict[str, str]:
    rows: dict[str, str] = {}
    for layout_id, rest in ROW.findall((ROOT / "docs" / "models.md").read_text()):
        assert layout_id not in rows, f"{layout_id} has two rows"
        rows[layout_id] = rest
    return rows
