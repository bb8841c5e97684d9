"""The subset of kustomize that deploy/kubernetes/ uses, to render it without kustomize.

`render(directory)` reads `kustomization.yaml` and returns the objects `kubectl
kustomize` would print for the fields this subset knows, and refuses any other
field, so that a kustomization using more than the subset fails here instead of
rendering differently:

- `resources`: YAML files (every document of each) and directories (rendered as
  kustomizations themselves: a base), in order;
- `patches`: `- path: FILE`, a strategic merge patch naming its object by
  apiVersion, kind and metadata.name (no `target`, no JSON 6902 patch);
- `namespace`: set on every object.

The strategic merge follows Kubernetes' rules for the fields these manifests patch:
maps merge key by key, a null deletes the key, lists of objects with a merge key
(containers, env and volumes by name, volumeMounts by mountPath, ports by
containerPort or port) merge item by item (items the base lacks are appended), and
every other list is replaced whole (args, command, volumeClaimTemplates: lists the
API marks with no merge strategy).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

KNOWN_FIELDS = frozenset({"apiVersion", "kind", "resources", "patches", "namespace"})
_MERGE_KEYS = {
    "containers": "name",
    "initContainers": "name",
    "env": "name",
    "volumes": "name",
    "volumeMounts": "mountPath",
    "imagePullSecrets": "name",
}

Obj = dict[str, Any]


class KustomizeError(ValueError):
    """The kustomization is outside the subset, or a patch does not apply."""


def load_documents(path: Path) -> list[Obj]:
    docs = [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
    for doc in docs:
        if not isinstance(doc, dict):
            raise KustomizeError(f"{path}: a document that is not a mapping")
    return docs


def render(directory: Path) -> list[Obj]:
    (kustomization,) = load_documents(directory / "kustomization.yaml")
    unknown = set(kustomization) - KNOWN_FIELDS
    if unknown:
        raise KustomizeError(f"{directory}: outside the subset: {sorted(unknown)}")
    objects: list[Obj] = []
    for resource in kustomization.get("resources", []):
        path = directory / resource
        objects += render(path) if path.is_dir() else load_documents(path)
    for patch in kustomization.get("patches", []):
        if set(patch) != {"path"}:
            raise KustomizeError(f"{directory}: a patch is `path: FILE` here, not {patch}")
        for doc in load_documents(directory / patch["path"]):
            _apply(objects, doc, directory / patch["path"])
    if "namespace" in kustomization:
        for obj in objects:
            obj.setdefault("metadata", {})["namespace"] = kustomization["namespace"]
    return objects


def identity(obj: Obj) -> tuple[str, str, str]:
    return obj["apiVersion"], obj["kind"], obj["metadata"]["name"]


def _apply(objects: list[Obj], patch: Obj, where: Path) -> None:
    matches = [i for i, obj in enumerate(objects) if identity(obj) == identity(patch)]
    if len(matches) != 1:
        raise KustomizeError(f"{where}: {identity(patch)} matches {len(matches)} objects")
    objects[matches[0]] = merge(objects[matches[0]], patch)


def merge(base: Any, patch: Any, field: str = "") -> Any:
    """`patch` merged into `base` (neither is changed)."""
    if isinstance(base, dict) and isinstance(patch, dict):
        out = dict(base)
        for key, value in patch.items():
            if value is None:
                out.pop(key, None)
            elif key in out:
                out[key] = merge(out[key], value, key)
            else:
                out[key] = value
        return out
    if isinstance(base, list) and isinstance(patch, list):
        key = _merge_key(field, [*base, *patch])
        if key is None:
            return patch
        out_list = list(base)
        for item in patch:
            at = next((i for i, old in enumerate(out_list) if old.get(key) == item.get(key)), None)
            if at is None:
                out_list.append(item)
            else:
                out_list[at] = merge(out_list[at], item)
        return out_list
    return patch


def _merge_key(field: str, items: list[Any]) -> str | None:
    if not items or not all(isinstance(item, dict) for item in items):
        return None
    if field == "ports":  # a container's ports merge by containerPort, a Service's by port
        return "containerPort" if all("containerPort" in item for item in items) else "port"
    return _MERGE_KEYS.get(field)
