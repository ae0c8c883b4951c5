"""deploy/kubernetes/: every manifest, base and rendered overlays, against the Kubernetes API's types
and against poolserve itself (its routes, flags, metrics and timeouts)."""

from __future__ import annotations

import ast
import copy
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from apiserver.connection.auth import OPEN_PATHS
from apiserver.requests.endpoints import ENDPOINTS
from poolserve.config import API_KEY_ENV
from supervisor.cli import build_parser, parse_config
from tests.deploy.kube_schema import (
    apply_json_patch,
    build,
    containers_of,
    identity,
    load_documents,
    manifest_errors,
    pointer_parent,
    target_of,
)

ROOT = Path(__file__).resolve().parents[2]
KUBE = ROOT / "deploy" / "kubernetes"
BASE = KUBE / "base"
OVERLAYS = sorted(path.parent for path in (KUBE / "overlays").glob("*/kustomization.yaml"))
ADAPTER_CONFIG = KUBE / "prometheus-adapter" / "config.yaml"
METRIC_MODULES = ("apiserver/metrics.py", "engine_core/metrics.py", "supervisor/metrics.py")
VARIANTS = {"base": BASE} | {path.name: path for path in OVERLAYS}


@pytest.fixture(scope="module", params=sorted(VARIANTS))
def rendered(request: pytest.FixtureRequest) -> list[dict[str, Any]]:
    """What one variant applies: the base's resources, or an overlay's after its patches."""
    return build(VARIANTS[request.param])


def one(docs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    (doc,) = [doc for doc in docs if doc["kind"] == kind]
    return doc


def container(docs: list[dict[str, Any]]) -> dict[str, Any]:
    (found,) = containers_of(one(docs, "Deployment"))
    return found


def flag_value(args: list[str], flag: str) -> str | None:
    return args[args.index(flag) + 1] if flag in args else None


def exported_metrics() -> dict[str, str]:
    """Every metric poolserve's modules define, by the name a scrape shows (a counter gains `_total`),
    with its type; read from the source so nothing is registered here."""
    names = {}
    for module in METRIC_MODULES:
        for node in ast.walk(ast.parse((ROOT / module).read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
                kind, name = node.func.id, node.args[0] if node.args else None
                if kind in ("Counter", "Gauge", "Histogram") and isinstance(name, ast.Constant):
                    names[str(name.value) + ("_total" if kind == "Counter" else "")] = kind
    return names


def test_the_overlays_exist() -> None:
    assert [path.name for path in OVERLAYS] == ["cpu", "gpu"]


def test_every_manifest_fits_the_kubernetes_api_types(rendered: list[dict[str, Any]]) -> None:
    checked = [doc for doc in rendered if doc["kind"] != "ServiceMonitor"]
    assert {doc["kind"] for doc in checked} == {
        "Deployment",
        "Service",
        "PodDisruptionBudget",
        "HorizontalPodAutoscaler",
    }
    for doc in checked:
        assert manifest_errors(doc) == [], doc["kind"]


def test_the_adapter_config_fits_the_kubernetes_api_types() -> None:
    (config_map,) = load_documents(ADAPTER_CONFIG)
    assert manifest_errors(config_map) == []


def test_the_checker_catches_unknown_fields_wrong_types_and_missing_required_fields() -> None:
    deployment = one(build(BASE), "Deployment")
    broken = copy.deepcopy(deployment)
    broken["spec"]["replicas"] = "2"
    probe = broken["spec"]["template"]["spec"]["containers"][0]["livenessProbe"]
    probe["httpGet"]["pathh"] = "/health/live"
    probe["periodSeconds"] = True
    broken["spec"]["template"]["spec"]["containers"][0]["ports"][0]["container_port"] = 8000  # the client's name
    errors = manifest_errors(broken)
    assert errors == [
        "$.spec.replicas: expected int, got str '2'",
        "$.spec.template.spec.containers[0].ports[0].container_port: V1ContainerPort has no field 'container_port'",
        "$.spec.template.spec.containers[0].livenessProbe.httpGet.pathh: V1HTTPGetAction has no field 'pathh'",
        "$.spec.template.spec.containers[0].livenessProbe.periodSeconds: expected int, got bool",
    ]
    del deployment["spec"]["template"]["spec"]["containers"][0]["name"]
    assert "name" in "".join(manifest_errors(deployment))
    assert manifest_errors({"apiVersion": "apps/v1beta1", "kind": "Deployment"}) != []


def test_the_service_monitor_has_the_prometheus_operators_shape(rendered: list[dict[str, Any]]) -> None:
    monitor, service = one(rendered, "ServiceMonitor"), one(rendered, "Service")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert set(monitor) == {"apiVersion", "kind", "metadata", "spec"}
    assert set(monitor["spec"]) <= {"selector", "endpoints", "namespaceSelector", "jobLabel"}
    assert set(monitor["spec"]["selector"]) == {"matchLabels"}
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    for endpoint in monitor["spec"]["endpoints"]:
        assert set(endpoint) <= {"port", "path", "interval", "scrapeTimeout", "scheme", "honorLabels"}
        assert all(isinstance(value, bool if key == "honorLabels" else str) for key, value in endpoint.items())
        assert endpoint["path"] == "/metrics"
        assert endpoint["port"] in [port["name"] for port in service["spec"]["ports"]]
        assert seconds(endpoint["scrapeTimeout"]) <= seconds(endpoint["interval"])


def test_the_service_monitor_keeps_poolserves_endpoint_label(rendered: list[dict[str, Any]]) -> None:
    """The operator sets `endpoint` to the port's name on every target; without honorLabels poolserve's `endpoint`
    (the route, docs/metrics.md) would arrive as `exported_endpoint` and the dashboard's `by (endpoint)` show "http"."""
    for endpoint in one(rendered, "ServiceMonitor")["spec"]["endpoints"]:
        assert endpoint["honorLabels"] is True


def seconds(duration: str) -> int:
    match = re.fullmatch(r"(\d+)([sm])", duration)
    assert match, duration
    return int(match[1]) * (60 if match[2] == "m" else 1)


def probe_errors(deployment: dict[str, Any]) -> list[str]:
    """Probes that would fail on a healthy server: a path the server does not route, or one that needs the
    key (probes carry none), or a port the container does not name."""
    routes = {endpoint.path for endpoint in ENDPOINTS if endpoint.method == "GET"}
    (spec,) = containers_of(deployment)
    port_names = {port["name"] for port in spec["ports"]}
    errors = []
    for kind in ("startupProbe", "livenessProbe", "readinessProbe"):
        http_get = spec[kind]["httpGet"]
        if http_get["path"] not in routes or http_get["path"] not in OPEN_PATHS:
            errors.append(f"{kind}: {http_get['path']} is not an open GET route")
        if http_get["port"] not in port_names:
            errors.append(f"{kind}: port {http_get['port']!r} is not a container port")
    return errors


def test_probes_hit_open_routes_for_what_each_probe_means(rendered: list[dict[str, Any]]) -> None:
    deployment = one(rendered, "Deployment")
    assert probe_errors(deployment) == []
    spec = container(rendered)
    assert spec["livenessProbe"]["httpGet"]["path"] == "/health/live"
    assert spec["readinessProbe"]["httpGet"]["path"] == "/health/ready"


def test_a_probe_on_a_wrong_path_or_port_is_caught() -> None:
    deployment = one(build(BASE), "Deployment")
    spec = deployment["spec"]["template"]["spec"]["containers"][0]
    spec["readinessProbe"]["httpGet"]["path"] = "/healthz"
    spec["livenessProbe"]["httpGet"]["path"] = "/v1/models"  # routed, but needs the key
    spec["startupProbe"]["httpGet"]["port"] = "metrics"
    assert probe_errors(deployment) == [
        "startupProbe: port 'metrics' is not a container port",
        "livenessProbe: /v1/models is not an open GET route",
        "readinessProbe: /healthz is not an open GET route",
    ]


def test_the_startup_probe_waits_out_the_engine_start_timeout(rendered: list[dict[str, Any]]) -> None:
    spec = container(rendered)
    config = parse_config(spec["args"])
    startup = spec["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] > config.engine_start_timeout


def test_ports_agree_across_deployment_service_and_scrape_config(rendered: list[dict[str, Any]]) -> None:
    deployment, service = one(rendered, "Deployment"), one(rendered, "Service")
    spec = container(rendered)
    (port,) = spec["ports"]
    assert port["containerPort"] == parse_config(spec["args"]).port
    (service_port,) = service["spec"]["ports"]
    assert service_port["targetPort"] in (port["name"], port["containerPort"])
    annotations = deployment["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/port"] == str(port["containerPort"])
    assert annotations["prometheus.io/path"] == "/metrics"


def test_selectors_pick_the_deployments_pods(rendered: list[dict[str, Any]]) -> None:
    deployment = one(rendered, "Deployment")
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"].items()
    assert deployment["spec"]["selector"]["matchLabels"].items() <= pod_labels
    assert one(rendered, "Service")["spec"]["selector"].items() <= pod_labels
    assert one(rendered, "PodDisruptionBudget")["spec"]["selector"]["matchLabels"].items() <= pod_labels
    target = one(rendered, "HorizontalPodAutoscaler")["spec"]["scaleTargetRef"]
    assert (target["apiVersion"], target["kind"], target["name"]) == ("apps/v1", "Deployment", "poolserve")


def test_the_autoscaler_follows_a_gauge_poolserve_exports(rendered: list[dict[str, Any]]) -> None:
    exported = exported_metrics()
    assert exported["poolserve_requests_total"] == "Counter"  # the reader sees the metric modules
    (metric,) = one(rendered, "HorizontalPodAutoscaler")["spec"]["metrics"]
    name = metric["pods"]["metric"]["name"]
    assert exported.get(name) == "Gauge", f"{name} is not a gauge poolserve exports"
    # The adapter serves it under the same name, one series per pod.
    (config_map,) = load_documents(ADAPTER_CONFIG)
    (rule,) = yaml.safe_load(config_map["data"]["config.yaml"])["rules"]
    assert rule["seriesQuery"].startswith(name + "{")
    assert rule["name"]["as"] == name
    assert re.fullmatch(rule["name"]["matches"], name)
    assert set(rule["resources"]["overrides"]) == {"namespace", "pod"}
    assert set(re.findall(r"<<\.\w+>>", rule["metricsQuery"])) == {"<<.Series>>", "<<.LabelMatchers>>", "<<.GroupBy>>"}


def test_container_args_are_launch_flags_with_valid_values(
    rendered: list[dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = container(rendered)
    options = {option for action in build_parser()._actions for option in action.option_strings}
    flags = [arg for arg in spec["args"] if arg.startswith("--")]
    assert set(flags) <= options
    assert len(flags) == len(set(flags)), "a flag given twice: the last one wins silently"
    monkeypatch.setenv(API_KEY_ENV, "from-the-secret")
    config = parse_config(spec["args"])
    assert config.host == "0.0.0.0"
    assert config.api_key == "from-the-secret"


def test_a_wrong_flag_in_the_args_is_caught() -> None:
    with pytest.raises(SystemExit):
        parse_config(["--host", "0.0.0.0", "--shutdown-grace", "30"])


def test_the_grace_period_outlasts_the_prestop_pause_and_the_drain(rendered: list[dict[str, Any]]) -> None:
    pod = one(rendered, "Deployment")["spec"]["template"]["spec"]
    spec = container(rendered)
    command = spec["lifecycle"]["preStop"]["exec"]["command"]
    assert command[0] == "sleep"
    pause = float(command[1])
    assert pause >= 5, "kube-proxy and ingresses need a few seconds to drop the endpoint"
    shutdown_timeout = parse_config(spec["args"]).shutdown_timeout
    assert flag_value(spec["args"], "--shutdown-timeout") is not None, "set it where the grace period can see it"
    assert pod["terminationGracePeriodSeconds"] > shutdown_timeout + pause


def test_the_api_key_comes_from_a_secret_through_the_variable_the_cli_reads(rendered: list[dict[str, Any]]) -> None:
    spec = container(rendered)
    assert "--api-key" not in spec["args"], "args show in `ps` and in the pod spec"
    (variable,) = [env for env in spec["env"] if env["name"] == API_KEY_ENV]
    assert set(variable["valueFrom"]) == {"secretKeyRef"}
    assert variable["valueFrom"]["secretKeyRef"].get("optional") is not True


def test_the_pod_runs_as_non_root_on_a_read_only_root(rendered: list[dict[str, Any]]) -> None:
    pod = one(rendered, "Deployment")["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] != 0
    security = container(rendered)["securityContext"]
    assert security["allowPrivilegeEscalation"] is False
    assert security["readOnlyRootFilesystem"] is True
    assert security["capabilities"]["drop"] == ["ALL"]
    # The runtime folder (sockets, metric files) needs a writable TMPDIR.
    mounts = [mount["mountPath"] for mount in container(rendered)["volumeMounts"]]
    tmpdir = next(env["value"] for env in container(rendered)["env"] if env["name"] == "TMPDIR")
    assert tmpdir in mounts
    # --runtime auto's ONNX graph (a CPU serving float32 or int8) is written on a writable volume too.
    cache = Path(flag_value(container(rendered)["args"], "--onnx-cache-dir") or "~/.cache (the default)")
    assert any(cache.is_relative_to(mount) for mount in mounts), cache


def test_each_variant_asks_for_its_device() -> None:
    cpu, gpu = container(build(VARIANTS["cpu"])), container(build(VARIANTS["gpu"]))
    assert flag_value(cpu["args"], "--device") == "cpu"
    assert "nvidia.com/gpu" not in cpu["resources"]["limits"]
    assert cpu["resources"]["limits"]["cpu"] == cpu["resources"]["requests"]["cpu"]
    assert flag_value(gpu["args"], "--device") == "cuda"
    assert gpu["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert (cpu["image"], gpu["image"]) == ("poolserve:cpu", "poolserve:cuda")
    targets = [
        one(build(VARIANTS[name]), "HorizontalPodAutoscaler")["spec"]["metrics"][0]["pods"]["target"]["averageValue"]
        for name in ("cpu", "gpu")
    ]
    assert targets == ["64", "512"]  # two full batches: --max-batch-size's default on each device


# What build() understands: a field outside these would be applied by kustomize and skipped by the checks.
KUSTOMIZATION_FIELDS = {"apiVersion", "kind", "resources", "patches", "images", "namespace", "labels"}


def test_kustomizations_use_only_the_fields_the_checks_apply() -> None:
    for folder in VARIANTS.values():
        kustomization = yaml.safe_load((folder / "kustomization.yaml").read_text())
        assert set(kustomization) <= KUSTOMIZATION_FIELDS, folder
        assert kustomization["kind"] == "Kustomization"
        for patch in kustomization.get("patches", []):
            assert set(patch) <= {"path", "target"}
            assert set(patch.get("target", {})) <= {"group", "version", "kind", "name"}
        for image in kustomization.get("images", []):
            assert set(image) <= {"name", "newName", "newTag"}
        for label_set in kustomization.get("labels", []):
            assert set(label_set) == {"pairs"}, "includeSelectors would rewrite the Deployment's immutable selector"


def test_overlay_patches_apply_to_resources_the_base_has() -> None:
    base = build(BASE)
    for overlay in OVERLAYS:
        kustomization = yaml.safe_load((overlay / "kustomization.yaml").read_text())
        assert kustomization["resources"] == ["../../base"]
        base_images = {c["image"].partition(":")[0] for doc in base for c in containers_of(doc)}
        assert {image["name"] for image in kustomization["images"]} <= base_images
        for patch in kustomization["patches"]:
            patch_docs = load_documents(overlay / patch["path"])
            if "target" in patch:
                target = target_of(patch, base)
                for operation in patch_docs[0]:
                    pointer_parent(target, operation["path"])  # raises when the path leads nowhere
            else:
                (patch_doc,) = patch_docs
                assert identity(patch_doc) in {identity(doc) for doc in base}, f"{overlay.name}/{patch['path']}"


def test_a_patch_into_nothing_is_caught() -> None:
    deployment = one(build(BASE), "Deployment")
    with pytest.raises(KeyError):
        apply_json_patch(deployment, [{"op": "add", "path": "/spec/template/spec/sidecars/0/args/-", "value": "x"}])
    with pytest.raises(LookupError):
        target_of({"target": {"version": "v1", "kind": "Deployment", "name": "poolserve"}}, [deployment])
