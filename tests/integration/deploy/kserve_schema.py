"""Check KServe manifests against the models the `kserve` package ships.

Usage: PYTHONPATH=FOLDER python kserve_schema.py MANIFEST.yaml...   prints one JSON list of
problems per file; FOLDER holds `kserve` and `kubernetes` installed without their dependencies
(`pip install --no-deps --target`): only their generated models are read, and those need six,
urllib3 and dateutil, which dlscale's venv has. The packages' own `__init__` (KServe's model
server, Kubernetes' config loaders) is not run: it imports what the models do not need.

Each document is rebuilt as KServe's model of its kind (kserve.models, with kubernetes.client's
models for the Kubernetes types inside): a field the schema does not know, a value of the wrong
type, or a required field left out is a problem.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import re
import sys
import types
from typing import Any

import yaml


def _bare(name: str) -> None:
    """The package `name` as an empty module over its folder: its submodules import, its
    `__init__` is not run."""
    found = importlib.util.find_spec(name)
    assert found is not None and found.submodule_search_locations is not None, name
    package = types.ModuleType(name)
    package.__path__ = list(found.submodule_search_locations)
    sys.modules[name] = package
    parent, _, child = name.rpartition(".")
    if parent:
        setattr(sys.modules[parent], child, package)


for _name in ("kserve", "kubernetes", "kubernetes.client"):
    _bare(_name)
kserve = importlib.import_module("kserve")
kubernetes = importlib.import_module("kubernetes")
importlib.import_module("kserve.models")
importlib.import_module("kubernetes.client.models")

KINDS = {
    ("serving.kserve.io/v1alpha1", "ServingRuntime"): "V1alpha1ServingRuntime",
    ("serving.kserve.io/v1alpha1", "ClusterServingRuntime"): "V1alpha1ClusterServingRuntime",
    ("serving.kserve.io/v1beta1", "InferenceService"): "V1beta1InferenceService",
}
PRIMITIVES = {"str": str, "int": int, "float": (int, float), "bool": bool, "object": object}


def build(data: Any, kind: str, where: str, problems: list[str]) -> Any:
    """`data` as an instance of the OpenAPI type `kind`, noting every mismatch."""
    # The Kubernetes models name their types in typing's style too.
    kind = re.sub(r"^Dict\[(\w+), (.*)\]$", r"dict(\1, \2)", re.sub(r"^List\[", "list[", kind))
    if kind.startswith("list["):
        if not isinstance(data, list):
            problems.append(f"{where}: expected a list, got {data!r}")
            return None
        return [build(v, kind[5:-1], f"{where}[{i}]", problems) for i, v in enumerate(data)]
    if kind.startswith("dict("):
        value_kind = re.match(r"dict\(([^,]*), (.*)\)", kind).group(2)  # type: ignore[union-attr]
        if not isinstance(data, dict):
            problems.append(f"{where}: expected a mapping, got {data!r}")
            return None
        return {k: build(v, value_kind, f"{where}.{k}", problems) for k, v in data.items()}
    if kind in PRIMITIVES:
        if not isinstance(data, PRIMITIVES[kind]):
            problems.append(f"{where}: expected {kind}, got {data!r}")
        return data
    if kind in ("IntOrString", "ResourceQuantity", "datetime"):
        return data
    model = getattr(kserve.models, kind, None) or getattr(kubernetes.client.models, kind)
    if not isinstance(data, dict):
        problems.append(f"{where}: expected an object ({kind}), got {data!r}")
        return None
    by_key = {key: attr for attr, key in model.attribute_map.items()}
    unknown = sorted(set(data) - set(by_key))
    problems += [f"{where}.{key}: not a field of {kind}" for key in unknown]
    kwargs = {
        by_key[key]: build(value, model.openapi_types[by_key[key]], f"{where}.{key}", problems)
        for key, value in data.items()
        if key in by_key
    }
    try:
        return model(**kwargs)
    except ValueError as exc:  # a required field left out
        problems.append(f"{where}: {exc}")
        return None


def check(path: str) -> list[str]:
    """Every problem of every document in the manifest file."""
    problems: list[str] = []
    with open(path) as handle:
        documents = [d for d in yaml.safe_load_all(handle) if d]
    for doc in documents:
        kind = KINDS.get((doc.get("apiVersion"), doc.get("kind")))
        if kind is None:
            problems.append(f"{doc.get('apiVersion')}/{doc.get('kind')}: not a KServe kind")
            continue
        build(doc, kind, doc["kind"], problems)
    return problems


if __name__ == "__main__":
    print(json.dumps({path: check(path) for path in sys.argv[1:]}))
