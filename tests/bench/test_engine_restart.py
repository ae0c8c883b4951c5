"""bench.engine_restart, briefly: one kill of the engine, timed to its ready line and to the first answer after it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path


def test_the_restart_bench_times_one_kill_of_a_forked_engine(tmp_path: Path) -> None:
    out = tmp_path / "restart.json"
    subprocess.run(
        [sys.executable, "-m", "bench.engine_restart", "--kills", "1", "--out", str(out), "--", "--dtype", "float32",
         "--device", "cpu"],
        check=True, capture_output=True, timeout=240,
    )  # fmt: skip
    (kill,) = json.loads(out.read_text())["kills"]
    assert kill["forked"] is True  # a CPU engine comes from the engine template
    assert kill["ready_s"] > 0 and kill["answered_s"] > 0 and kill["backoff_s"] == 0.0
