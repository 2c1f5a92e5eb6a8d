"""The Grafana dashboard (deploy/grafana/dlscale.json) queries only metrics the server exports."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import tritonclient.http as th
from tests.toolkit.repositories import serving_repository
from tests.toolkit.server import serving
from tritonclient.utils import InferenceServerException

DASHBOARD = Path(__file__).resolve().parents[3] / "deploy" / "grafana" / "dlscale.json"
#: PromQL's functions, aggregations and keywords: the names in an expression that are no metric.
PROMQL = {
    "sum", "avg", "min", "max", "count", "rate", "irate", "increase", "histogram_quantile",
    "by", "without", "on", "ignoring", "group_left", "group_right", "label_values",
    "clamp_min", "clamp_max", "and", "or", "unless",
}  # fmt: skip


def _expressions(dashboard: dict[str, Any]) -> list[str]:
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    for variable in dashboard["templating"]["list"]:
        query = variable.get("query")
        if isinstance(query, dict):
            exprs.append(query["query"])
    return exprs


def metric_names(expr: str) -> set[str]:
    """The metric names an expression reads."""
    expr = re.sub(r"\{[^}]*\}", "", expr)  # label matchers
    expr = re.sub(r"\[[^\]]*\]", "", expr)  # range durations
    expr = re.sub(r"\b(by|without|on|ignoring)\s*\([^)]*\)", "", expr)  # grouping labels
    expr = re.sub(r",\s*\w+\s*\)", ")", expr)  # label_values(metric, label)
    tokens = set(re.findall(r"[A-Za-z_:][A-Za-z0-9_:]*", expr))
    return {t for t in tokens if t not in PROMQL}


def test_the_name_reader_reads_promql() -> None:
    expr = (
        'histogram_quantile(0.99, sum by (le, model) (rate(x_bucket{model=~"$m"}[5m]))) '
        "/ label_values(y, model)"
    )
    assert metric_names(expr) == {"x_bucket", "y"}


def _exported(text: str) -> set[str]:
    names = set()
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            name, kind = line.split()[2:4]
            names.add(name)
            if kind == "histogram":
                names |= {f"{name}_bucket", f"{name}_sum", f"{name}_count"}
        elif line and not line.startswith("#"):
            names.add(re.split(r"[{ ]", line, maxsplit=1)[0])
    return names


def test_every_metric_the_dashboard_queries_is_exported(tmp_path: Path) -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    with serving(serving_repository(tmp_path), metrics_port=0) as server:
        client = th.InferenceServerClient(server.http_url)
        x = th.InferInput("input", [2, 16], "FP32")
        x.set_data_from_numpy(np.ones((2, 16), np.float32))
        client.infer("identity", [x])
        bad = th.InferInput("input", [2, 15], "FP32")
        bad.set_data_from_numpy(np.ones((2, 15), np.float32))
        with pytest.raises(InferenceServerException):
            client.infer("identity", [bad])
        client.close()
        text = httpx.get(f"http://127.0.0.1:{server.server.ports['metrics']}/metrics").text
    exported = _exported(text)
    queried = set().union(*(metric_names(e) for e in _expressions(dashboard)))
    assert queried, "the dashboard queries nothing"
    assert queried <= exported, f"queried but not exported: {sorted(queried - exported)}"
    # Everything the traffic produced is on the dashboard, GPU telemetry included.
    assert {"nv_inference_request_failure", "nv_gpu_utilization"} <= queried


def test_the_dashboard_is_importable_json() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["uid"] and dashboard["title"] == "dlscale"
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    for panel in dashboard["panels"]:
        assert set(panel["gridPos"]) == {"x", "y", "w", "h"}
        refs = [t["refId"] for t in panel.get("targets", [])]
        assert len(refs) == len(set(refs)), panel["title"]
        assert panel["type"] == "row" or panel["datasource"]["uid"] == "${datasource}"
