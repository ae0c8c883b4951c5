"""bench.served_share, briefly: sentence-transformers' float32 ceiling and poolserve float32 served over the same
sentences in one round, and the share between them."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path


def test_the_served_share_bench_runs_a_round(tmp_path: Path) -> None:
    out = tmp_path / "share.json"
    subprocess.run(
        [sys.executable, "-m", "bench.served_share", "--rounds", "1", "--seconds", "1", "--warmup", "0.5",
         "--clients", "2", "--api-servers", "1", "--sentences", "64", "--out", str(out)],
        check=True, capture_output=True, timeout=240,
    )  # fmt: skip
    (row,) = json.loads(out.read_text())["rounds"]
    assert row["ceiling"]["sentences_per_s"] > 0
    assert row["served"]["errors"] == 0 and row["served"]["sentences_per_s"] > 0
    assert row["served_share"] == round(row["served"]["sentences_per_s"] / row["ceiling"]["sentences_per_s"], 3)
