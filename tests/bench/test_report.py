from __future__ import annotations

from typing import Any

import pytest

from bench.harness.targets import targets
from bench.loadgen import tokens_of
from bench.report import DOCS_END, DOCS_START, render, replace_docs_block


def run(
    workload: str, config: str, concurrency: int, items: float, *, p50: float, p99: float, **extra: Any
) -> dict[str, Any]:
    return {
        "workload": workload, "config": config, "concurrency": concurrency, "target": "poolserve",
        "requests_per_s": items, "items_per_s": items, "tokens_per_s": items * 20, "api_servers": 1,
        "preprocess_workers": 1, "latency_ms": {"p50": p50, "p90": p99, "p99": p99, "max": p99},
        "errors": {}, "server_share": {"0": 1.0}, "generator": {"cpu_share": 0.1},
        "prober": {"latency_ms": {"p50": 0.5, "p99": 3.0}}, **extra,
    }  # fmt: skip


def results() -> dict[str, Any]:
    offline = {"best": {"items_per_s": 200.0, "batch_size": 32, "order": "length-sorted", "tokens_per_s": 4000.0},
               "single_latency_ms": {"p50": 5.0}, "model": "bundled", "mean_tokens": 20.0,
               "frontend_per_s_one_thread": 10000.0, "torch_threads": 2}  # fmt: skip
    return {
        "meta": {"label": "unit", "started": "now", "command": "python -m bench.sweep", "elapsed_s": 1.0,
                 "git": {"commit": "abc", "branch": "bench", "dirty": False}, "versions": {"torch": "2.13.0"},
                 "machine": {"cpu": "cpu", "usable_cores": 2, "memory_gb": 24, "kernel": "k", "python": "3.11",
                             "load_average_at_start": [0.1]}},
        "ceiling": [],
        "offline": {"short": offline, "batch16": offline},
        "runs": [
            run("short", "1 API, 1 thread", 1, 150.0, p50=5.3, p99=9.0),
            run("short", "1 API, 1 thread", 32, 190.0, p50=150.0, p99=200.0),
            run("short", "infinity", 32, 100.0, p50=300.0, p99=400.0, target="infinity", server_share={"-": 1.0}),
            run("image", "1 API, 1 thread", 32, 100.0, p50=300.0, p99=400.0),
            run("image", "2 API, 1 thread", 32, 170.0, p50=150.0, p99=200.0, api_servers=2),
        ],
        "memory": [{"workload": "short", "config": "1 API, 1 thread", "processes": [
            {"role": "apiserver", "rss_mb": 80.0, "peak_rss_mb": 90.0},
            {"role": "engine", "rss_mb": 500.0, "peak_rss_mb": 520.0}]}],
        "startup": {"median_s": 4.2, "runs": [{"ready_after_s": 4.2, "memory_idle": []}]},
        "skipped": [],
        "priority": {"unloaded": {"p50": 20.0, "p99": 50.0}, "under bulk, priority 0": {"p50": 600.0, "p99": 1000.0},
                     "under bulk, priority -1": {"p50": 60.0, "p99": 120.0}, "bulk inputs/s": 80.0,
                     "bulk statuses": {"200": 40}, "bulk failures": 0,
                     "settings": {"bulk_clients": 4, "bulk_inputs": 64, "queries": 40, "gap": 0.1, "api_servers": 2}},
        "cache": {"sentences": 300, "repeats": 10, "runs": {
            "cache 0": {"repeated sentences/s": 97.0, "distinct sentences/s": 88.0, "hits": 0.0},
            "cache 67108864": {"repeated sentences/s": 326.0, "distinct sentences/s": 92.0, "hits": 2700.0}}},
    }  # fmt: skip


def verdicts() -> dict[str, str]:
    return {row[0]: row[3] for row in targets(results(), default_api_servers=1)}


def test_targets_compare_the_right_figures() -> None:
    found = verdicts()
    assert found["1 efficiency (short)"] == "meets"  # 190 / 200 = 0.95
    assert found["1 efficiency (batch16)"] == "not measured"
    assert found["2 vs Infinity, (a) c=32, throughput"] == "meets"  # 1.9x
    assert found["2 vs Infinity, (a) c=32, p99"] == "meets"  # 0.5x
    assert found["3 overhead, (a) c=1, p50 minus offline"] == "meets"  # 0.3 ms
    assert found["4 scale-out, (c), 2 vs 1 API server"] == "meets"  # 1.7x
    assert found["5 /health p99, (c) c=32, 1 API, thread pool (default)"] == "meets"
    assert found["6 memory, each API server (peak RSS)"] == "meets"
    assert found["7 start-up, bundled, 2 API servers"] == "meets"


def test_points_with_too_few_replies_are_left_out_of_the_targets() -> None:
    data = results()
    data["runs"][1]["warnings"] = ["few replies (3): lengthen --duration"]
    rows = {row[0]: row for row in targets(data, default_api_servers=1)}
    assert rows["1 efficiency (short)"][1].startswith("150.0 / 200.0")  # the c=32 point no longer counts
    assert rows["2 vs Infinity, (a) c=32, throughput"][3] == "not measured"
    assert "1 of 5 points carry a warning" in render(data)


def test_a_miss_says_by_how_much() -> None:
    data = results()
    data["startup"]["median_s"] = 6.5
    rows = {row[0]: row[3] for row in targets(data, default_api_servers=1)}
    assert rows["7 start-up, bundled, 2 API servers"] == "misses (6.50 vs 5.00)"


def test_render_has_a_table_per_served_workload_and_blanks_peer_tokens() -> None:
    markdown = render(results(), "plot.png")
    assert "### Served: (a) short text" in markdown and "### Served: (c)" in markdown
    assert "### Served: (b)" not in markdown
    infinity_row = next(line for line in markdown.splitlines() if line.startswith("| infinity |"))
    assert infinity_row.split(" | ")[4] == "—"
    assert "![throughput and p99 against concurrency](../bench/results/plot.png)" in markdown


def test_docs_block_is_replaced_between_markers_only() -> None:
    document = f"intro\n{DOCS_START}\nold\n{DOCS_END}\noutro\n"
    assert replace_docs_block(document, "new\n") == f"intro\n{DOCS_START}\nnew\n{DOCS_END}\noutro\n"
    with pytest.raises(ValueError, match="no"):
        replace_docs_block("no markers", "x")


def test_tokens_come_from_openai_usage_and_are_zero_otherwise() -> None:
    assert tokens_of(b'{"data": [{"embedding": [0.1, 0.2]}], "usage": {"prompt_tokens": 7, "total_tokens": 7}}') == 7
    assert tokens_of(b"[[0.1, 0.2]]") == 0
    assert tokens_of(b'{"error": {"message": "x"}}') == 0
    assert tokens_of(b"not json") == 0


def test_the_priority_and_cache_workloads_get_their_tables_and_the_query_target_its_verdict() -> None:
    markdown = render(results())
    assert "### Queries during bulk indexing (priority)" in markdown
    assert "| under bulk, priority -1 | 60.0 | 120.0 |" in markdown
    assert "| 67108864 | 326.0 | 92.0 | 2,700 |" in markdown
    assert verdicts()["query p99 under bulk (priority -1) / unloaded"] == "misses (2.40 vs 2.00)"
    without = {key: value for key, value in results().items() if key not in ("priority", "cache")}
    assert "Not measured in this run." in render(without)
