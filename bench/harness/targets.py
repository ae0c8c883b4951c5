"""Issue 7's targets, judged from a sweep's results: which figures each compares, the goal, the verdict."""

from __future__ import annotations

import math
from typing import Any

from bench.harness.tables import Results, fmt, runs_of


def is_reliable(run: dict[str, Any]) -> bool:
    """False for a point with too few replies in its window to give a rate or a percentile."""
    return not any(warning.startswith("few replies") for warning in run.get("warnings", []))


def measured_runs(results: Results, workload: str, target: str) -> list[dict[str, Any]]:
    return [run for run in runs_of(results, workload, target) if is_reliable(run)]


def best_run(runs: list[dict[str, Any]], key: str = "items_per_s") -> dict[str, Any] | None:
    return max(runs, key=lambda run: run[key], default=None)


def verdict(value: float | None, goal: float, at_least: bool) -> str:
    if value is None or math.isnan(value):
        return "not measured"
    ok = value >= goal if at_least else value <= goal
    return "meets" if ok else f"misses ({fmt(value, 2)} vs {fmt(goal, 2)})"


def ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def targets(results: Results, default_api_servers: int = 1) -> list[list[str]]:
    """One row per target of issue 7: what was measured, the goal, the verdict."""
    rows: list[list[str]] = []
    offline = results.get("offline", {})
    # 1. efficiency on (a) and (b)
    for workload in ("short", "batch16"):
        best = best_run(measured_runs(results, workload, "poolserve"))
        ceiling = offline.get(workload, {}).get("best", {}).get("items_per_s")
        value = ratio(best["items_per_s"] if best else None, ceiling)
        measured = f"{fmt(best['items_per_s'] if best else None)} / {fmt(ceiling)} items/s = {fmt(value, 2)}"
        rows.append(
            [
                f"1 efficiency ({workload})",
                measured + (f" ({best['config']}, c={best['concurrency']})" if best else ""),
                ">= 0.90 x offline",
                verdict(value, 0.90, True),
            ]
        )
    # 2. versus Infinity on (a) at 32 clients
    ours = best_run([r for r in measured_runs(results, "short", "poolserve") if r["concurrency"] == 32])
    theirs = best_run([r for r in measured_runs(results, "short", "infinity") if r["concurrency"] == 32])
    speed = ratio(ours["items_per_s"] if ours else None, theirs["items_per_s"] if theirs else None)
    tail = ratio(ours["latency_ms"]["p99"] if ours else None, theirs["latency_ms"]["p99"] if theirs else None)
    rows.append(
        [
            "2 vs Infinity, (a) c=32, throughput",
            f"{fmt(ours['items_per_s'] if ours else None)} vs {fmt(theirs['items_per_s'] if theirs else None)}"
            f" sentences/s = {fmt(speed, 2)}",
            ">= 1.6 x",
            verdict(speed, 1.6, True),
        ]
    )
    rows.append(
        [
            "2 vs Infinity, (a) c=32, p99",
            f"{fmt(ours['latency_ms']['p99'] if ours else None)} vs "
            f"{fmt(theirs['latency_ms']['p99'] if theirs else None)} ms = {fmt(tail, 2)}",
            "<= 0.6 x",
            verdict(tail, 0.6, False),
        ]
    )
    # 3. overhead at one client
    single = [r for r in measured_runs(results, "short", "poolserve") if r["concurrency"] == 1]
    fastest = min(single, key=lambda r: r["latency_ms"]["p50"], default=None)
    offline_p50 = offline.get("short", {}).get("single_latency_ms", {}).get("p50")
    overhead = fastest["latency_ms"]["p50"] - offline_p50 if fastest and offline_p50 is not None else None
    rows.append(
        [
            "3 overhead, (a) c=1, p50 minus offline",
            f"{fmt(fastest['latency_ms']['p50'] if fastest else None, 2)} - {fmt(offline_p50, 2)} = "
            f"{fmt(overhead, 2)} ms",
            "<= 0.5 ms",
            verdict(overhead, 0.5, False),
        ]
    )
    # 4. scale-out on (c)
    image = measured_runs(results, "image", "poolserve")
    one = best_run([r for r in image if r["api_servers"] == 1])
    two = best_run([r for r in image if r["api_servers"] == 2])
    scale = ratio(two["items_per_s"] if two else None, one["items_per_s"] if one else None)
    rows.append(
        [
            "4 scale-out, (c), 2 vs 1 API server",
            f"{fmt(two['items_per_s'] if two else None)} vs {fmt(one['items_per_s'] if one else None)} "
            f"images/s = {fmt(scale, 2)}",
            ">= 1.6 x",
            verdict(scale, 1.6, True),
        ]
    )
    # 5. liveness while (c) saturates, default settings, the inline figure beside
    top = max((r["concurrency"] for r in image), default=0)
    for preprocess, name in ((1, "thread pool (default)"), (0, "inline")):
        run = next(
            (
                r
                for r in image
                if r["concurrency"] == top
                and r["api_servers"] == default_api_servers
                and r["preprocess_workers"] == preprocess
            ),
            None,
        )
        p99 = run.get("prober", {}).get("latency_ms", {}).get("p99") if run else None
        rows.append(
            [
                f"5 /health p99, (c) c={top}, {default_api_servers} API, {name}",
                f"{fmt(p99, 2)} ms",
                "<= 5 ms" if preprocess else "(for comparison)",
                verdict(p99, 5.0, False) if preprocess else "—",
            ]
        )
    # 6. memory with the bundled model
    api_peaks: list[float] = []
    engine_peaks: list[float] = []
    entries = [e for e in results.get("memory", []) if e["workload"] in ("short", "batch16")]
    entries += [{"processes": run["memory_idle"]} for run in (results.get("startup") or {}).get("runs", [])]
    for entry in entries:
        for process in entry["processes"]:
            peak = process.get("peak_rss_mb")
            if peak is not None:
                (
                    api_peaks if process["role"] == "apiserver" else engine_peaks if process["role"] == "engine" else []
                ).append(peak)
    worst_api = max(api_peaks, default=None)
    rows.append(
        [
            "6 memory, each API server (peak RSS)",
            f"{fmt(worst_api, 0)} MB; engine peak {fmt(max(engine_peaks, default=None), 0)} MB",
            "<= 150 MB",
            verdict(worst_api, 150, False),
        ]
    )
    # 7. start-up
    median = (results.get("startup") or {}).get("median_s")
    rows.append(["7 start-up, bundled, 2 API servers", f"{fmt(median, 2)} s", "<= 5 s", verdict(median, 5.0, False)])
    # Issue 14: a query at priority -1 under bulk load against the same query unloaded.
    mix = results.get("priority") or {}
    loaded_p99 = mix.get("under bulk, priority -1", {}).get("p99")
    alone_p99 = mix.get("unloaded", {}).get("p99")
    value = ratio(loaded_p99, alone_p99)
    rows.append(
        [
            "query p99 under bulk (priority -1) / unloaded",
            f"{fmt(loaded_p99)} / {fmt(alone_p99)} ms = {fmt(value, 2)}",
            "<= 2 x",
            verdict(value, 2.0, False),
        ]
    )
    return rows
