"""The sweep's picture: per workload, throughput and p99 against concurrency, one line per configuration."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bench.harness.tables import runs_of
from bench.report import TITLES


def plot_results(results: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    workloads = [name for name in TITLES if runs_of(results, name)]
    if not workloads:
        return
    figure, axes = plt.subplots(len(workloads), 2, figsize=(12, 3.6 * len(workloads)), squeeze=False)
    for row, workload in zip(axes, workloads, strict=True):
        throughput, tail = row
        configs: dict[str, list[dict[str, Any]]] = {}
        for run in runs_of(results, workload):
            configs.setdefault(run["config"], []).append(run)
        for config, runs in configs.items():
            runs.sort(key=lambda run: run["concurrency"])
            x = [run["concurrency"] for run in runs]
            style = "--" if runs[0].get("target") != "poolserve" else "-"
            throughput.plot(x, [run["items_per_s"] for run in runs], style, marker="o", label=config)
            tail.plot(x, [run["latency_ms"]["p99"] for run in runs], style, marker="o", label=config)
        offline = results.get("offline", {}).get(workload)
        if offline:
            throughput.axhline(offline["best"]["items_per_s"], color="grey", linestyle=":", label="offline ceiling")
        throughput.set_title(f"{TITLES[workload]}: throughput", fontsize=9)
        throughput.set_ylabel("items/s")
        tail.set_title(f"{TITLES[workload]}: p99 latency", fontsize=9)
        tail.set_ylabel("p99 ms")
        tail.set_yscale("log")
        for axis in row:
            axis.set_xscale("log", base=2)
            axis.set_xlabel("concurrent clients")
            axis.grid(True, alpha=0.3)
        throughput.legend(fontsize=7)
    label = results["meta"].get("label") or ""
    figure.suptitle(f"poolserve bench {results['meta']['started']} {label}".strip(), fontsize=10)
    figure.tight_layout()
    figure.savefig(path, dpi=90)
    plt.close(figure)
