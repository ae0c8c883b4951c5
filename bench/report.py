"""Turns a sweep's results (JSON) into the markdown tables of docs/benchmarks.md and the target verdicts.

    python -m bench.report bench/results/<file>.json [--update-docs]

Pure functions over the results dict, so the tables can be rebuilt from any saved run.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path
from typing import Any

from bench.harness.tables import Results, fmt, runs_of, table
from bench.harness.targets import ratio, targets

DOCS_START = "<!-- bench:results:start -->"
DOCS_END = "<!-- bench:results:end -->"
TITLES = {
    "short": "(a) short text, 1 sentence per request, MiniLM",
    "batch16": "(b) 16 sentences per request, MiniLM",
    "image": "(c) one 640x480 JPEG per request, tiny CLIP (224x224, patch 32)",
    "long": "(d) one 512-token text per request, tiny BERT",
}


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


def priority_section(results: Results) -> str:
    mix = results.get("priority") or {}
    if not mix:
        return "Not measured in this run."
    settings = mix["settings"]
    rows = [
        [name, fmt(mix[name]["p50"]), fmt(mix[name]["p99"])]
        for name in ("unloaded", "under bulk, priority 0", "under bulk, priority -1")
    ]
    query_ratio = ratio(mix["under bulk, priority -1"]["p99"], mix["unloaded"]["p99"])
    shown = "—" if query_ratio is None else f"{query_ratio:.2f}"
    return (
        f"{settings['bulk_clients']} bulk clients sending {settings['bulk_inputs']} sentences per request back to "
        f"back, one query every {settings['gap']} s ({settings['queries']} per priority), "
        f"{settings['api_servers']} API servers (bench/priority_mix.py).\n\n"
        + table(["one-sentence query", "p50 ms", "p99 ms"], rows)
        + f"\n\nPriority -1 under bulk / unloaded, p99: {shown} (target <= 2). Bulk served "
        f"{mix['bulk inputs/s']} inputs/s meanwhile, statuses {mix['bulk statuses']}, "
        f"{mix['bulk failures']} failures."
    )


def cache_section(results: Results) -> str:
    cache = results.get("cache") or {}
    if not cache:
        return "Not measured in this run."
    rows = [
        [label.removeprefix("cache "), fmt(run["repeated sentences/s"]), fmt(run["distinct sentences/s"]),
         fmt(run["hits"], 0)]
        for label, run in cache["runs"].items()
    ]  # fmt: skip
    return (
        f"{cache['sentences']} sentences each sent {cache['repeats']} times in a shuffled order (repeated), "
        f"and as many sentences none twice (distinct); 8 clients, 4 sentences per request, 2 API servers "
        "(bench/cache_repeat.py).\n\n"
        + table(["`--cache-bytes`", "repeated, sentences/s", "distinct, sentences/s", "hits"], rows)
    )


def render(results: Results, plot_name: str = "") -> str:
    from poolserve.config import default_api_server_count

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
        "",
        "### Queries during bulk indexing (priority)",
        "",
        priority_section(results),
        "",
        "### Repeated corpus (embedding cache)",
        "",
        cache_section(results),
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
