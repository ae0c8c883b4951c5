"""Turns a sweep's results (JSON) into the markdown tables of docs/benchmarks.md and the target verdicts.

    python -m bench.report bench/results/<file>.json [--update-docs]

Pure functions over the results dict, so the tables can be rebuilt from any saved run.
"""

from __future__ import annotations

import argparse
import json
import math
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

DOCS_START = "<!-- bench:results:start -->"
DOCS_END = "<!-- bench:results:end -->"
TITLES = {
    "short": "(a) short text, 1 sentence per request, MiniLM",
    "batch16": "(b) 16 sentences per request, MiniLM",
    "image": "(c) one 640x480 JPEG per request, tiny CLIP (224x224, patch 32)",
    "long": "(d) one 512-token text per request, tiny BERT",
}
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


def is_reliable(run: dict[str, Any]) -> bool:
    """False for a point with too few replies in its window to give a rate or a percentile."""
    return not any(warning.startswith("few replies") for warning in run.get("warnings", []))


def measured_runs(results: Results, workload: str, target: str) -> list[dict[str, Any]]:
    return [run for run in runs_of(results, workload, target) if is_reliable(run)]


def best_run(runs: list[dict[str, Any]], key: str = "items_per_s") -> dict[str, Any] | None:
    return max(runs, key=lambda run: run[key], default=None)


def header_section(results: Results) -> str:
    meta = results["meta"]
    machine, git = meta["machine"], meta["git"]
    versions = ", ".join(f"{name} {version}" for name, version in meta["versions"].items())
    dirty = " (with uncommitted changes)" if git["dirty"] else ""
    lines = [
        f"Run `{meta.get('label') or 'unlabelled'}`, started {meta['started']}, "
        f"took {fmt(meta.get('elapsed_s'), 0)} s.",
        "",
        f"- Machine: {machine['cpu']}, {machine['usable_cores']} usable cores, {machine['memory_gb']} GB, "
        f"Linux {machine['kernel']}, Python {machine['python']}; load average at start "
        f"{machine['load_average_at_start']}, at end {machine.get('load_average_at_end', '—')}.",
        f"- Versions: {versions}.",
        f"- Commit: `{git['commit'][:12]}` on `{git['branch']}`{dirty}.",
        f"- Command: `{meta['command']}`.",
    ]
    runs = results.get("runs", [])
    flagged = [run for run in runs if run.get("warnings")]
    if flagged:
        lines.append(
            f"- {len(flagged)} of {len(runs)} points carry a warning (the `notes` column); points with too few "
            "replies in their window are left out of the targets."
        )
    if results.get("skipped"):
        lines.append(
            f"- Skipped: {'; '.join(s['what'] + ' (' + s['why'].splitlines()[0] + ')' for s in results['skipped'])}."
        )
    return "\n".join(lines)


def ceiling_section(results: Results) -> str:
    rows = [
        [
            r["workload"],
            r["client"],
            str(r["concurrency"]),
            fmt(r["requests_per_s"], 0),
            fmt(r["items_per_s"], 0),
            fmt(r["latency_ms"]["p50"], 2),
            fmt(r["latency_ms"]["p99"], 2),
            fmt(r["generator"]["cpu_share"], 2),
        ]
        for r in results.get("ceiling", [])
    ]
    header = ["workload", "client", "clients", "req/s", "items/s", "p50 ms", "p99 ms", "generator CPU (cores)"]
    return table(header, rows)


def offline_section(results: Results) -> str:
    rows = []
    for name, r in results.get("offline", {}).items():
        best = r["best"]
        rows.append(
            [
                name,
                r["model"],
                fmt(best["items_per_s"]),
                str(best["batch_size"]),
                best["order"],
                fmt(best["tokens_per_s"], 0),
                fmt(r["single_latency_ms"]["p50"], 2),
                fmt(r["mean_tokens"]),
                fmt(r["frontend_per_s_one_thread"], 0),
                str(r["torch_threads"]),
            ]
        )
    header = [
        "workload",
        "model",
        "best items/s",
        "batch",
        "order",
        "tokens/s",
        "1-input p50 ms",
        "mean tokens",
        "frontend items/s (1 thread)",
        "torch threads (best)",
    ]
    return table(header, rows)


def served_section(results: Results, workload: str) -> str:
    rows = []
    for r in runs_of(results, workload):
        latency = r["latency_ms"]
        prober = r.get("prober", {}).get("latency_ms", {})
        shares = {str(i): 0.0 for i in range(r.get("api_servers", 0))} | r.get("server_share", {})
        # "-": replies without x-poolserve-server (a peer).
        share = " / ".join(f"{v:.0%}" for v in shares.values()) if shares and "-" not in shares else "—"
        # Infinity's `usage` counts characters unless it runs with --lengths-via-tokenize.
        tokens = fmt(r["tokens_per_s"], 0) if r.get("target", "poolserve") == "poolserve" else "—"
        errors = ", ".join(f"{k}: {v}" for k, v in r.get("errors", {}).items()) or "0"
        notes = "; ".join(r.get("warnings", [])) or ""
        rows.append(
            [
                r["config"],
                str(r["concurrency"]),
                fmt(r["requests_per_s"]),
                fmt(r["items_per_s"]),
                tokens,
                fmt(latency["p50"]),
                fmt(latency["p90"]),
                fmt(latency["p99"]),
                fmt(latency["max"]),
                errors,
                f"{fmt(prober.get('p50'), 2)} / {fmt(prober.get('p99'), 2)}",
                share,
                fmt(r["generator"]["cpu_share"], 2),
                notes,
            ]
        )
    header = [
        "configuration",
        "clients",
        "req/s",
        "items/s",
        "tokens/s",
        "p50 ms",
        "p90 ms",
        "p99 ms",
        "max ms",
        "errors",
        "/health p50 / p99 ms",
        "share per API server",
        "gen. CPU",
        "notes",
    ]
    return table(header, rows)


def memory_section(results: Results) -> str:
    rows = []
    for entry in results.get("memory", []):
        by_role: dict[str, list[dict[str, Any]]] = {}
        for process in entry["processes"]:
            by_role.setdefault(process["role"], []).append(process)
        api = by_role.get("apiserver", [])
        rows.append(
            [
                entry["workload"],
                entry["config"],
                " / ".join(
                    f"{fmt(p.get('rss_mb'), 0)} ({fmt(p.get('peak_rss_mb'), 0)})" for p in by_role.get("engine", [])
                ),
                " / ".join(f"{fmt(p.get('rss_mb'), 0)} ({fmt(p.get('peak_rss_mb'), 0)})" for p in api),
                " / ".join(fmt(p.get("rss_mb"), 0) for p in by_role.get("supervisor", [])),
            ]
        )
    return table(
        ["workload", "configuration", "engine MB now (peak)", "each API server MB now (peak)", "supervisor MB"], rows
    )


def startup_section(results: Results) -> str:
    startup = results.get("startup") or {}
    if not startup:
        return "Not measured in this run."
    runs = ", ".join(f"{run['ready_after_s']:.2f}" for run in startup["runs"])
    return (
        f"`launch --api-server-count 2`, bundled model, `launch` started to ready line: median "
        f"**{startup['median_s']:.2f} s** (runs: {runs} s)."
    )


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
    return rows


def render(results: Results, plot_name: str = "") -> str:
    from engine_core.config import default_api_server_count

    parts = [
        header_section(results),
        "",
        "### Targets",
        "",
        table(["target", "measured", "goal", "verdict"], targets(results, default_api_server_count())),
        "",
        "### Load generator ceiling (against bench.trivial_server)",
        "",
        ceiling_section(results),
        "",
        "### Offline ceiling (engine runner in-process)",
        "",
        offline_section(results),
    ]
    for workload, title in TITLES.items():
        if runs_of(results, workload):
            parts += ["", f"### Served: {title}", "", served_section(results, workload)]
    parts += [
        "",
        "### Memory after the runs (from /proc)",
        "",
        memory_section(results),
        "",
        "### Start-up",
        "",
        startup_section(results),
    ]
    if plot_name:
        parts += ["", f"![throughput and p99 against concurrency](../bench/results/{plot_name})"]
    return "\n".join(parts) + "\n"


def replace_docs_block(document: str, block: str) -> str:
    """The document with the text between the bench markers replaced by `block`."""
    pattern = re.compile(re.escape(DOCS_START) + ".*?" + re.escape(DOCS_END), re.S)
    if not pattern.search(document):
        raise ValueError(f"no {DOCS_START} ... {DOCS_END} block to replace")
    return pattern.sub(lambda _: f"{DOCS_START}\n{block}{DOCS_END}", document)


def write_report(results: Results, stem: Path, update_docs: Path | None = None) -> str:
    plot_path = stem.with_suffix(".png")
    try:
        from bench.plot import plot_results

        plot_results(results, plot_path)
        plot_name = plot_path.name
    except ImportError:
        plot_name = ""  # matplotlib is in the `bench` extra
    markdown = render(results, plot_name)
    stem.with_suffix(".md").write_text(markdown)
    if update_docs is not None:
        update_docs.write_text(replace_docs_block(update_docs.read_text(), markdown))
    return markdown


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else "")
    parser.add_argument("results", type=Path)
    parser.add_argument("--update-docs", action="store_true", help="Replace the results block of docs/benchmarks.md.")
    args = parser.parse_args(argv)
    results = json.loads(args.results.read_text())
    docs = Path(__file__).resolve().parent.parent / "docs" / "benchmarks.md"
    print(write_report(results, args.results.with_suffix(""), docs if args.update_docs else None))


if __name__ == "__main__":
    main()
