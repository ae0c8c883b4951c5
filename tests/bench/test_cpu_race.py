"""bench.cpu_race, briefly: poolserve served under one point, its vectors checked against sentence-transformers; with
`make bench-onnx-peer` installed, Infinity's ONNX Runtime engine beside it and the ratio between them."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from bench import onnx_peer
from bench.cpu_race import ratios


def test_the_ratios_are_taken_within_one_pass_at_one_point() -> None:
    def run(pass_: int, target: str, clients: int, rps: float, p99: float) -> dict[str, object]:
        return {"pass": pass_, "target": target, "clients": clients, "workload": "a", "requests_per_s": rps,
                "p99_ms": p99}  # fmt: skip

    runs = [
        run(0, "poolserve float32", 1, 60.0, 20.0), run(0, "infinity onnx fp32", 1, 80.0, 16.0),
        run(1, "poolserve float32", 1, 90.0, 10.0), run(1, "infinity onnx fp32", 1, 60.0, 20.0),
        run(0, "poolserve float32", 32, 120.0, 300.0),
    ]  # fmt: skip
    assert ratios(runs) == [
        {"pass": 0, "ratio": "float32 / onnx fp32", "point": "1:a", "throughput": 0.75, "p99": 1.25},
        {"pass": 1, "ratio": "float32 / onnx fp32", "point": "1:a", "throughput": 1.5, "p99": 0.5},
    ]


def test_the_race_runs_briefly(tmp_path: Path) -> None:
    targets = ["poolserve float32"]
    if reason := onnx_peer.missing():
        print(f"Infinity's ONNX engine left out: {reason}")
    else:
        targets.append("infinity onnx fp32")
    out = tmp_path / "race.json"
    subprocess.run(
        [sys.executable, "-m", "bench.cpu_race", "--targets", ",".join(targets), "--points", "2:a", "--seconds", "2",
         "--warmup", "0.5", "--passes", "1", "--out", str(out)],
        check=True, capture_output=True, timeout=600,
    )  # fmt: skip
    result = json.loads(out.read_text())
    assert [run["target"] for run in result["runs"]] == targets
    for run in result["runs"]:
        assert run["errors"] == 0 and run["requests_per_s"] > 0 and run["cores"] > 0
    # Each is what sentence-transformers gives, at float32's precision.
    assert all(cos > 0.9999 for cos in result["cos_min"].values()), result["cos_min"]
    assert len(result["ratios"]) == len(targets) - 1


def test_interleaved_every_target_is_up_at_once_and_each_point_runs_on_each_in_turn(tmp_path: Path) -> None:
    targets = ["poolserve float32", "poolserve int8"]
    out = tmp_path / "race.json"
    subprocess.run(
        [sys.executable, "-m", "bench.cpu_race", "--targets", ",".join(targets), "--points", "1:a,2:a", "--seconds",
         "1", "--warmup", "0.5", "--passes", "2", "--interleave", "--out", str(out)],
        check=True, capture_output=True, timeout=600,
    )  # fmt: skip
    result = json.loads(out.read_text())
    order = [(run["pass"], run["clients"], run["target"]) for run in result["runs"]]
    assert order == [
        (0, 1, "poolserve float32"), (0, 1, "poolserve int8"), (0, 2, "poolserve float32"), (0, 2, "poolserve int8"),
        (1, 1, "poolserve int8"), (1, 1, "poolserve float32"), (1, 2, "poolserve int8"), (1, 2, "poolserve float32"),
    ]  # fmt: skip
    assert all(run["errors"] == 0 and run["requests_per_s"] > 0 for run in result["runs"])
    assert set(result["idle_cores"]) == set(targets)
    assert all(0 <= cores < 0.5 for cores in result["idle_cores"].values()), result["idle_cores"]
