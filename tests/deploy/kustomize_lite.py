"""A small stand-in for ``kubectl kustomize``, for machines without kubectl.

It knows exactly the kustomization features that ``deploy/k8s`` uses, and refuses any other
key, so a kustomization that starts using something new fails here loudly rather than render
differently:

- ``resources``: YAML files (one or more documents) and directories holding a kustomization;
- ``secretGenerator`` with ``literals``, only with ``generatorOptions.disableNameSuffixHash``;
- ``patches``: inline JSON 6902 patches (``add``, ``replace``, ``remove``) on a ``target``
  given by ``kind`` and ``name``, or by ``kind`` alone (every object of that kind);
- ``labels``: ``pairs`` with ``includeSelectors: true``, on StatefulSets and
  PodDisruptionBudgets only: added to the objects' labels, and to every selector and template
  of theirs that kustomize adds them to;
- ``nameSuffix``: appended to every object's name (no name reference among the objects of
  the kustomization it applies to needs updating: ``deploy/k8s`` has none);
- ``replicas``: ``spec.replicas`` of the named workload, by its name after the suffix.

They apply in kustomize's order: resources, generators, patches, labels, the suffix,
replicas. When kubectl is on PATH, ``tests/deploy/test_manifests.py`` checks that both render
the same objects.
"""

from __future__ import annotations

import base64
import copy
from pathlib import Path
from typing import Any

import yaml

Manifest = dict[str, Any]
KUSTOMIZATION = "kustomization.yaml"
_SCALABLE_KINDS = ("Deployment", "ReplicaSet", "ReplicationController", "StatefulSet")
_KNOWN_KEYS = {"apiVersion", "kind", "resources", "secretGenerator", "generatorOptions",
               "patches", "labels", "nameSuffix", "replicas"}
_LABEL_SELECTORS = {
    "StatefulSet": (("spec/selector/matchLabels", True), ("spec/template/metadata/labels", True),
                    ("spec/volumeClaimTemplates/*/metadata/labels", True),
                    ("spec/template/spec/affinity/*/requiredDuringSchedulingIgnoredDuringExecution"
                     "/*/labelSelector/matchLabels", False),
                    ("spec/template/spec/affinity/*/preferredDuringSchedulingIgnoredDuringExecution"
                     "/*/podAffinityTerm/labelSelector/matchLabels", False),
                    ("spec/template/spec/topologySpreadConstraints/*/labelSelector/matchLabels",
                     False)),
    "PodDisruptionBudget": (("spec/selector/matchLabels", False),),
}
"""Where ``labels`` with ``includeSelectors`` puts its pairs besides ``metadata/labels``, by
kind (``*``: every key or item), and whether kustomize creates the maps of the path that are
missing (it adds to an affinity term's selector only if it has ``matchLabels``)."""


def render(directory: Path) -> list[Manifest]:
    """The objects the kustomization in ``directory`` builds."""
    spec = yaml.safe_load((directory / KUSTOMIZATION).read_text())
    unknown = set(spec) - _KNOWN_KEYS
    if unknown:
        raise NotImplementedError(f"{directory / KUSTOMIZATION}: {sorted(unknown)}")
    objects = [obj for resource in spec.get("resources", [])
               for obj in _load(directory / resource)]
    objects += _secrets(spec)
    for patch in spec.get("patches", []):
        _apply_patch(objects, patch)
    for labels in spec.get("labels", []):
        _add_labels(objects, labels)
    for obj in objects:
        obj["metadata"]["name"] += spec.get("nameSuffix", "")
    for replicas in spec.get("replicas", []):
        _find(objects, _SCALABLE_KINDS, replicas["name"])["spec"]["replicas"] = replicas["count"]
    return objects


def load_documents(path: Path) -> list[Manifest]:
    """Every non-empty YAML document in ``path``."""
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def _load(path: Path) -> list[Manifest]:
    return render(path) if path.is_dir() else load_documents(path)


def _secrets(spec: dict[str, Any]) -> list[Manifest]:
    generators = spec.get("secretGenerator", [])
    if generators and not spec.get("generatorOptions", {}).get("disableNameSuffixHash"):
        raise NotImplementedError("secretGenerator without disableNameSuffixHash (name hashes)")
    secrets = []
    for generator in generators:
        if set(generator) != {"name", "literals"}:
            raise NotImplementedError(f"secretGenerator fields {sorted(generator)}")
        data = dict(literal.split("=", 1) for literal in generator["literals"])
        secrets.append({"apiVersion": "v1", "kind": "Secret",
                        "metadata": {"name": generator["name"]}, "type": "Opaque",
                        "data": {key: base64.b64encode(value.encode()).decode()
                                 for key, value in data.items()}})
    return secrets


def _find(objects: list[Manifest], kinds: tuple[str, ...], name: str) -> Manifest:
    found = [obj for obj in objects if obj["metadata"]["name"] == name and obj["kind"] in kinds]
    if len(found) != 1:
        raise LookupError(f"{len(found)} objects of kind {' or '.join(kinds)} named {name}")
    return found[0]


def _apply_patch(objects: list[Manifest], patch: dict[str, Any]) -> None:
    if set(patch) != {"target", "patch"} or set(patch["target"]) not in ({"kind", "name"},
                                                                         {"kind"}):
        raise NotImplementedError(f"patch fields {sorted(patch)}: only target (kind, and "
                                  "maybe name) and an inline JSON 6902 patch")
    kind = patch["target"]["kind"]
    if "name" in patch["target"]:
        targets = [_find(objects, (kind,), patch["target"]["name"])]
    else:
        targets = [obj for obj in objects if obj["kind"] == kind]
        if not targets:
            raise LookupError(f"no object of kind {kind} to patch")
    for target in targets:
        for operation in yaml.safe_load(patch["patch"]):
            _apply_operation(target, operation)


def _add_labels(objects: list[Manifest], labels: dict[str, Any]) -> None:
    if set(labels) != {"pairs", "includeSelectors"} or labels["includeSelectors"] is not True:
        raise NotImplementedError(f"labels fields {sorted(labels)}: only pairs with "
                                  "includeSelectors: true")
    pairs = labels["pairs"]
    for obj in objects:
        if obj["kind"] not in _LABEL_SELECTORS:
            raise NotImplementedError(f"labels on a {obj['kind']}: which of its fields "
                                      "kustomize labels is not known here")
        obj["metadata"].setdefault("labels", {}).update(pairs)
        for path, create in _LABEL_SELECTORS[obj["kind"]]:
            for labels_map in _walk(obj, path.split("/"), create):
                labels_map.update(pairs)


def _walk(node: Any, parts: list[str], create: bool) -> list[dict[str, Any]]:
    """The maps at ``parts`` below ``node`` (``*``: every key or item); a missing map is made
    if ``create`` (none that would hold items), else the path gives none."""
    if not parts:
        return [node] if isinstance(node, dict) else []
    head, *rest = parts
    if head == "*":
        children = node.values() if isinstance(node, dict) else node if isinstance(
            node, list) else []
        return [found for child in children for found in _walk(child, rest, create)]
    if isinstance(node, dict) and (head in node or (create and rest[:1] != ["*"])):
        return _walk(node.setdefault(head, {}), rest, create)
    return []


def _apply_operation(document: Manifest, operation: dict[str, Any]) -> None:
    op = operation["op"]
    if op not in ("add", "replace", "remove"):
        raise NotImplementedError(f"JSON 6902 operation {op!r}")
    *parents, key = [part.replace("~1", "/").replace("~0", "~")
                     for part in operation["path"].split("/")[1:]]
    parent: Any = document
    for part in parents:
        parent = parent[int(part)] if isinstance(parent, list) else parent[part]
    if isinstance(parent, list):
        index = len(parent) if key == "-" else int(key)
        if op == "add":
            parent.insert(index, copy.deepcopy(operation["value"]))
            return
        if not 0 <= index < len(parent):
            raise IndexError(f"{operation['path']}: nothing to {op}")
        key = index
    elif op != "add" and key not in parent:
        raise KeyError(f"{operation['path']}: nothing to {op}")
    if op == "remove":
        del parent[key]
    else:
        parent[key] = copy.deepcopy(operation["value"])
