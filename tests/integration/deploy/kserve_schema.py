"""Check KServe manifests against the models the `kserve` package ships (run in its own venv).

Usage: python kserve_schema.py MANIFEST.yaml...   prints one JSON list of problems per file.

Each document is rebuilt as KServe's model of its kind (kserve.models, with kubernetes.client's
models for the Kubernetes types inside): a field the schema does not know, a value of the wrong
type, or a required field left out is a problem.
"""

from __future__ import annotations

import json
import re
import sys
from typing import Any

import kserve.models
import kubernetes.client.models
import yaml

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
