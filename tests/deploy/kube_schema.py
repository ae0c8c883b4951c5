"""Offline checks of Kubernetes manifests: strict typing against the API's own models, and the part of
kustomize (strategic-merge and JSON 6902 patches, images, namespace) our overlays use."""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import yaml
from kubernetes.client import models

# kind -> the client's model of the apiVersion we write: an apiVersion we do not know fails the check.
MODELS = {
    ("apps/v1", "Deployment"): "V1Deployment",
    ("v1", "Service"): "V1Service",
    ("v1", "ConfigMap"): "V1ConfigMap",
    ("v1", "Secret"): "V1Secret",
    ("policy/v1", "PodDisruptionBudget"): "V1PodDisruptionBudget",
    ("autoscaling/v2", "HorizontalPodAutoscaler"): "V2HorizontalPodAutoscaler",
}
# Strategic merge merges these lists item by item on the key (their patchMergeKey in the API);
# every other list is replaced whole, as the API server and kustomize do for lists without one.
MERGE_KEYS = {
    "containers": "name",
    "initContainers": "name",
    "env": "name",
    "volumes": "name",
    "ports": "containerPort",
}
MERGE_KEYS |= {"volumeMounts": "mountPath"}

LIST_TYPE = re.compile(r"^(?:List|list)\[(.+)\]$")
DICT_TYPE = re.compile(r"^(?:Dict\[str, (.+)\]|dict\(str, (.+)\))$")


def load_documents(path: Path) -> list[Any]:
    """A YAML file's documents: manifests (maps), or a JSON 6902 patch (a list of operations)."""
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc is not None]


def type_errors(value: Any, type_name: str, where: str = "$") -> list[str]:
    """Every place `value` strays from the client's type `type_name`: a field the model does not have
    (its JSON name, as the API server reads it), or a value of the wrong type, at any depth."""
    if value is None:
        return [f"{where}: null where {type_name} belongs"]
    if match := LIST_TYPE.match(type_name):
        if not isinstance(value, list):
            return [f"{where}: expected a list of {match[1]}, got {type(value).__name__}"]
        return [error for i, item in enumerate(value) for error in type_errors(item, match[1], f"{where}[{i}]")]
    if match := DICT_TYPE.match(type_name):
        if not isinstance(value, dict):
            return [f"{where}: expected a map, got {type(value).__name__}"]
        inner = match[1] or match[2]
        return [error for key, item in value.items() for error in type_errors(item, inner, f"{where}.{key}")]
    scalar = scalar_error(value, type_name, where)
    if scalar is not None:
        return [] if scalar == "" else [scalar]
    model = getattr(models, type_name)
    if not isinstance(value, dict):
        return [f"{where}: expected a {type_name} object, got {type(value).__name__}"]
    fields = {json_name: attribute for attribute, json_name in model.attribute_map.items()}
    errors = []
    for key, item in value.items():
        if key not in fields:
            errors.append(f"{where}.{key}: {type_name} has no field {key!r}")
        else:
            errors.extend(type_errors(item, model.openapi_types[fields[key]], f"{where}.{key}"))
    return errors


def scalar_error(value: Any, type_name: str, where: str) -> str | None:
    """'' when `value` fits the scalar type, a message when it does not, None when the type is a model."""
    expected: dict[str, tuple[type, ...]] = {
        "str": (str,),
        "bool": (bool,),
        "int": (int,),
        "float": (int, float),
        # IntOrString fields (ports, maxUnavailable): the client types them as plain objects.
        "object": (int, str),
        "datetime": (str,),
        "date": (str,),
    }
    if type_name not in expected:
        return None
    # YAML's `true` is an int to Python; the API never takes one for the other.
    if isinstance(value, bool) and bool not in expected[type_name]:
        return f"{where}: expected {type_name}, got bool"
    if not isinstance(value, expected[type_name]):
        return f"{where}: expected {type_name}, got {type(value).__name__} {value!r}"
    return ""


def manifest_errors(doc: dict[str, Any]) -> list[str]:
    """Strict type errors of one manifest, then the fields the API requires (the model's own validation)."""
    key = (doc.get("apiVersion"), doc.get("kind"))
    if key not in MODELS:
        return [f"no model for apiVersion/kind {key}"]
    errors = type_errors(doc, MODELS[key])
    if not errors:
        try:
            getattr(models, MODELS[key]).model_validate(doc)
        except ValueError as exc:  # pydantic's ValidationError: a required field is missing
            errors.append(str(exc))
    return errors


def strategic_merge(base: Any, patch: Any, field: str = "") -> Any:
    if isinstance(base, dict) and isinstance(patch, dict):
        merged = dict(base)
        for key, value in patch.items():
            merged[key] = strategic_merge(base[key], value, key) if key in base else copy.deepcopy(value)
        return merged
    if isinstance(base, list) and isinstance(patch, list) and field in MERGE_KEYS:
        merge_key = MERGE_KEYS[field]
        merged_list = list(base)
        for item in patch:
            index = next((i for i, old in enumerate(merged_list) if old.get(merge_key) == item.get(merge_key)), None)
            if index is None:
                merged_list.append(copy.deepcopy(item))
            else:
                merged_list[index] = strategic_merge(merged_list[index], item)
        return merged_list
    return copy.deepcopy(patch)


def pointer_parent(doc: Any, path: str) -> tuple[Any, str]:
    """The container a JSON pointer's last step indexes into, and that step; KeyError/IndexError if absent."""
    *steps, last = [step.replace("~1", "/").replace("~0", "~") for step in path.lstrip("/").split("/")]
    node = doc
    for step in steps:
        node = node[int(step)] if isinstance(node, list) else node[step]
    return node, last


def apply_json_patch(doc: dict[str, Any], operations: list[dict[str, Any]]) -> dict[str, Any]:
    """The operations our overlays use (add, replace, test), strict like kustomize's: a path into
    something absent raises."""
    doc = copy.deepcopy(doc)
    for operation in operations:
        parent, last = pointer_parent(doc, operation["path"])
        op = operation["op"]
        if op == "add" and isinstance(parent, list):
            if last == "-":
                parent.append(operation["value"])
            else:
                parent.insert(int(last), operation["value"])
        elif op in ("add", "replace"):
            if op == "replace":
                _ = parent[int(last)] if isinstance(parent, list) else parent[last]
            parent[int(last) if isinstance(parent, list) else last] = operation["value"]
        elif op == "test":
            found = parent[int(last)] if isinstance(parent, list) else parent[last]
            if found != operation["value"]:
                raise ValueError(f"test {operation['path']}: {found!r} is not {operation['value']!r}")
        else:
            raise ValueError(f"unsupported JSON patch op {op!r}")
    return doc


def identity(doc: dict[str, Any]) -> tuple[str, str, str]:
    group = doc["apiVersion"].rpartition("/")[0]
    return group, doc["kind"], doc["metadata"]["name"]


def target_of(patch: dict[str, Any], docs: list[dict[str, Any]]) -> dict[str, Any]:
    """The one resource a kustomization patch entry's `target` selects (group, version, kind, name)."""
    target = patch["target"]
    chosen = [
        doc
        for doc in docs
        if doc["kind"] == target["kind"]
        and doc["metadata"]["name"] == target["name"]
        and doc["apiVersion"] == "/".join(part for part in (target.get("group", ""), target["version"]) if part)
    ]
    if len(chosen) != 1:
        raise LookupError(f"patch target {target} selects {len(chosen)} resources")
    return chosen[0]


def build(folder: Path) -> list[dict[str, Any]]:
    """What `kustomize build folder` gives for our kustomizations (resources, patches, images,
    namespace, labels); a patch that selects nothing raises."""
    kustomization = yaml.safe_load((folder / "kustomization.yaml").read_text())
    docs: list[dict[str, Any]] = []
    for resource in kustomization.get("resources", []):
        path = folder / resource
        docs.extend(build(path) if path.is_dir() else load_documents(path))
    for patch in kustomization.get("patches", []):
        patch_docs = load_documents(folder / patch["path"])
        if "target" in patch:
            target = target_of(patch, docs)
            docs[docs.index(target)] = apply_json_patch(target, patch_docs[0])
            continue
        (patch_doc,) = patch_docs
        matches = [i for i, doc in enumerate(docs) if identity(doc) == identity(patch_doc)]
        if len(matches) != 1:
            raise LookupError(f"strategic-merge patch {patch['path']} matches {len(matches)} resources")
        docs[matches[0]] = strategic_merge(docs[matches[0]], patch_doc)
    for doc in docs:
        apply_kustomization_fields(doc, kustomization)
    return docs


def apply_kustomization_fields(doc: dict[str, Any], kustomization: dict[str, Any]) -> None:
    if "namespace" in kustomization:
        doc["metadata"]["namespace"] = kustomization["namespace"]
    for label_set in kustomization.get("labels", []):
        doc["metadata"].setdefault("labels", {}).update(label_set["pairs"])
    for image in kustomization.get("images", []):
        for container in containers_of(doc):
            name, _, _tag = container["image"].partition(":")
            if name == image["name"]:
                container["image"] = f"{image.get('newName', name)}:{image.get('newTag', _tag)}"


def containers_of(doc: dict[str, Any]) -> list[dict[str, Any]]:
    if doc["kind"] != "Deployment":
        return []
    containers: list[dict[str, Any]] = doc["spec"]["template"]["spec"]["containers"]
    return containers
