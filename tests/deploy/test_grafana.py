"""deploy/grafana/poolserve.json against poolserve itself: every query reads metrics poolserve registers and
docs/metrics.md documents, with labels they have, and the dashboard is one Grafana imports as it is."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from prometheus_client.metrics import MetricWrapperBase

import apiserver.metrics
import engine_core.metrics
import supervisor.metrics
from poolserve.metric_files import DROPPED_NAME
from tests.deploy.dashboard import all_panels, load_dashboard, queries
from tests.deploy.promql import Checked, ParseError, Vector, check

ROOT = Path(__file__).resolve().parents[2]
METRICS_DOC = ROOT / "docs" / "metrics.md"
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
# Labels Prometheus gives every series of a target; the dashboard's variables filter on them.
TARGET_LABELS = frozenset({"job", "instance"})
# Grafana 10.0 writes 38, 11.x 39 to 41: older would be migrated on import, newer than 11 knows refused.
SCHEMA_VERSIONS = range(38, 42)
LABEL_VALUES = re.compile(r"^label_values\((?P<selector>.+),\s*(?P<label>[a-zA-Z_]\w*)\)$")


def registered_families() -> dict[str, tuple[str, frozenset[str]]]:
    """Every metric family poolserve's processes register: name -> (type, labels)."""
    families = {}
    for module in (apiserver.metrics, engine_core.metrics, supervisor.metrics):
        for metric in vars(module).values():
            if isinstance(metric, MetricWrapperBase):
                # `_labelnames` has no public accessor; describe() gives the name and type without labels.
                (described,) = metric.describe()
                families[described.name] = (described.type, frozenset(metric._labelnames))
    # Written straight into a metric file of its own (poolserve/metric_files.py), not through a Counter.
    families[DROPPED_NAME] = ("counter", frozenset())
    return families


def exposed_series() -> dict[str, frozenset[str]]:
    """The names /metrics shows (counters with `_total`; histograms' `_bucket`, `_sum`, `_count`) and their labels.
    No `_created`: prometheus_client's multiprocess mode does not write it."""
    series = {}
    for name, (kind, labels) in registered_families().items():
        if kind == "counter":
            series[f"{name}_total"] = labels
        elif kind == "histogram":
            series |= {f"{name}_bucket": labels | {"le"}, f"{name}_sum": labels, f"{name}_count": labels}
        else:
            series[name] = labels
    return series


def documented_series() -> dict[str, frozenset[str]]:
    """docs/metrics.md's tables, as the names /metrics shows and the labels each row names."""
    documented: dict[str, frozenset[str]] = {}
    for line in METRICS_DOC.read_text().splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) < 4 or not re.fullmatch(r"`poolserve_\w+`", cells[0]):
            continue
        name, kind = cells[0].strip("`"), cells[1].split()[0]
        labels = frozenset(re.findall(r"`(\w+)`", re.sub(r"\([^)]*\)", "", cells[2])))
        if kind == "histogram":
            documented |= {f"{name}_bucket": labels | {"le"}, f"{name}_sum": labels, f"{name}_count": labels}
        else:
            documented[name] = labels
    return documented


def checked(expr: str, labels: dict[str, frozenset[str]]) -> Checked:
    return check(expr, lambda name: labels[name] | TARGET_LABELS)


def test_every_query_reads_registered_metrics_by_labels_they_have() -> None:
    exposed = exposed_series()
    problems = []
    for where, expr in queries(load_dashboard()):
        try:
            result = checked(expr, exposed)
        except ParseError as exc:
            problems.append(f"{where}: {exc}: {expr}")
            continue
        problems += [f"{where}: {problem}" for problem in result.problems]
    assert not problems, "\n".join(problems)


def test_every_query_reads_documented_metrics_by_documented_labels() -> None:
    documented = documented_series()
    problems = []
    for where, expr in queries(load_dashboard()):
        problems += [f"{where}: {problem} in docs/metrics.md" for problem in checked(expr, documented).problems]
    assert not problems, "\n".join(problems)


def test_every_metric_family_poolserve_registers_has_a_panel() -> None:
    read = {
        selector.name for _, expr in queries(load_dashboard()) for selector in checked(expr, exposed_series()).selectors
    }
    missing = [name for name, kind_labels in registered_families().items() if not read & names_of(name, kind_labels[0])]
    assert not missing, f"no panel reads {missing}"


def names_of(family: str, kind: str) -> set[str]:
    if kind == "counter":
        return {f"{family}_total"}
    if kind == "histogram":
        return {f"{family}_bucket", f"{family}_sum", f"{family}_count"}
    return {family}


def test_every_selector_is_filtered_by_the_job_and_instance_variables() -> None:
    """Otherwise picking a job or an instance would leave a panel showing every server Prometheus scrapes."""
    unfiltered = []
    for where, expr in queries(load_dashboard()):
        for selector in checked(expr, exposed_series()).selectors:
            if not {("job", "=~", "$job"), ("instance", "=~", "$instance")} <= set(selector.matchers):
                unfiltered.append(f"{where}: {selector.name}")
    assert not unfiltered, "\n".join(unfiltered)


def test_ranges_follow_the_scrape_interval() -> None:
    """`$__rate_interval` is at least four scrape intervals whatever the zoom: a fixed [1m] is empty at 30 s scrapes."""
    ranges = {
        selector.range
        for _, expr in queries(load_dashboard())
        for selector in checked(expr, exposed_series()).selectors
        if selector.range
    }
    assert ranges == {"$__rate_interval"}


def test_every_selector_of_a_model_s_figures_is_filtered_by_the_model_variable() -> None:
    """A server of several models labels each model's figures with its served name (`model`; the model-info gauge's
    `model_name`): picking a model shows its figures alone."""
    unfiltered = []
    exposed = exposed_series()
    for where, expr in queries(load_dashboard()):
        for selector in checked(expr, exposed).selectors:
            labels = exposed[selector.name]
            label = "model" if "model" in labels else "model_name" if "model_name" in labels else None
            if label is not None and (label, "=~", "$model") not in selector.matchers:
                unfiltered.append(f"{where}: {selector.name}")
    assert not unfiltered, "\n".join(unfiltered)


def test_the_variables_are_a_prometheus_datasource_then_job_then_instance_then_model() -> None:
    variables = {variable["name"]: variable for variable in load_dashboard()["templating"]["list"]}
    assert list(variables) == ["datasource", "job", "instance", "model"]
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    exposed = exposed_series()
    for name in ("job", "instance", "model"):
        variable = variables[name]
        assert variable["type"] == "query" and variable["datasource"] == DATASOURCE
        assert variable["includeAll"] and variable["multi"] and variable["allValue"] == ".*"
        match = LABEL_VALUES.match(variable["query"]["query"])
        assert match and match["label"] == name and variable["definition"] == variable["query"]["query"]
        result = checked(match["selector"], exposed)
        assert isinstance(result.result, Vector) and not result.problems and name in result.result.labels


def test_every_panel_and_query_uses_the_datasource_variable() -> None:
    for panel in all_panels(load_dashboard()["panels"]):
        if panel["type"] == "row":
            assert "targets" not in panel
            continue
        assert panel["datasource"] == DATASOURCE, panel["title"]
        assert panel["targets"], panel["title"]
        ref_ids = [target["refId"] for target in panel["targets"]]
        assert len(set(ref_ids)) == len(ref_ids), panel["title"]
        for target in panel["targets"]:
            assert target["datasource"] == DATASOURCE, panel["title"]


def test_panel_ids_are_unique_and_panels_do_not_overlap() -> None:
    dashboard = load_dashboard()
    assert dashboard["schemaVersion"] in SCHEMA_VERSIONS and dashboard["uid"] == "poolserve"
    panels = list(all_panels(dashboard["panels"]))
    ids = [panel["id"] for panel in panels]
    assert len(set(ids)) == len(ids)
    cells: dict[tuple[int, int], str] = {}
    for panel in dashboard["panels"]:  # the grid of what is shown; a collapsed row's panels are not on it
        position = panel["gridPos"]
        assert position["x"] >= 0 and position["w"] > 0 and position["x"] + position["w"] <= 24, panel["title"]
        for x in range(position["x"], position["x"] + position["w"]):
            for y in range(position["y"], position["y"] + position["h"]):
                assert (x, y) not in cells, f"{panel['title']!r} overlaps {cells[(x, y)]!r}"
                cells[(x, y)] = panel["title"]
    assert [panel["title"] for panel in panels if panel["type"] == "row"] == [
        "Overview",
        "Requests",
        "Latency",
        "Engine",
        "Load and admission",
        "Embedding cache",
        "API servers and connections",
        "Processes and metrics health",
    ]


def test_every_query_parses_as_promql_for_promtool(tmp_path: Path) -> None:
    """Prometheus' own parser (promtool, from Debian's `prometheus`) over every query, Grafana's interval put in."""
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool is not installed (Debian's `prometheus` package has it)")
    rules = [
        {"alert": f"panel_{index}", "expr": expr.replace("$__rate_interval", "1m")}
        for index, (_, expr) in enumerate(queries(load_dashboard()))
    ]
    path = tmp_path / "dashboard-rules.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "poolserve-dashboard", "rules": rules}]}))
    checked_rules = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True, text=True, check=False)
    assert checked_rules.returncode == 0, checked_rules.stdout + checked_rules.stderr


def test_the_checker_catches_a_wrong_name_a_missing_label_and_a_match_on_nothing() -> None:
    exposed = exposed_series()
    selector = 'job=~"$job", instance=~"$instance"'
    assert checked(f"sum(rate(poolserve_request_total{{{selector}}}[5m]))", exposed).problems == [
        "poolserve_request_total: no such metric"
    ]
    assert checked(f"sum by (status) (rate(poolserve_prompt_tokens_total{{{selector}}}[5m]))", exposed).problems == [
        "sum by (status): its argument has no 'status' label"
    ]
    mismatched = checked(
        f"sum by (endpoint) (rate(poolserve_requests_total{{{selector}}}[5m]))"
        f" / sum(rate(poolserve_requests_total{{{selector}}}[5m]))",
        exposed,
    )
    assert len(mismatched.problems) == 1 and "no series would match" in mismatched.problems[0]
    lost_le = checked(f"histogram_quantile(0.9, sum(rate(poolserve_batch_inputs_bucket{{{selector}}}[5m])))", exposed)
    assert lost_le.problems == ["histogram_quantile: its buckets have no 'le' label (kept by the aggregation?)"]
    with pytest.raises(ParseError):
        checked("sum(rate(poolserve_requests_total[5m])) / on(job) sum(rate(poolserve_images_total[5m]))", exposed)
