"""Per-replica load of a fleet, for `dlscale bench --fleet-metrics URL`.

A fleet (`dlscale serve --device-workers`, `--ray`) serves one metrics page of every replica,
each sample labelled by the replica that counted it (`device` for device workers, `replica` on
Ray). Read before and after the run, the difference of each replica's requests and rows for
the model says how the router spread the run's load: the share of each replica, side by side
with the run's throughput and latency. Over the network only: any fleet with such labels is
measured the same way.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import httpx
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

from dlscale.errors import BenchError

#: The labels that name a replica on a fleet's page, in the order they are looked for.
REPLICA_LABELS = ("replica", "device")
#: Triton's counters (kept under their names, without `_total`): requests, and rows inferred.
COUNTERS = {"nv_inference_request_success": "requests", "nv_inference_count": "rows"}


def families(url: str) -> Iterable[Metric]:
    """The metric families on a fleet's page (`url`, `/metrics` added when it lacks it)."""
    page = url.rstrip("/").removesuffix("/metrics") + "/metrics"
    try:
        text = httpx.get(page, timeout=30).raise_for_status().text
    except httpx.HTTPError as exc:
        raise BenchError(f"--fleet-metrics {page}: {exc}") from None
    return text_string_to_metric_families(text)


def snapshot(url: str, model: str) -> dict[str, dict[str, float]]:
    """Each replica's successful requests and rows for `model` so far, from the fleet's page."""
    counts: dict[str, dict[str, float]] = {}
    for family in families(url):
        for sample in family.samples:
            kind = COUNTERS.get(sample.name.removesuffix("_total"))
            if kind is None or sample.labels.get("model") != model:
                continue
            replica = next((sample.labels[k] for k in REPLICA_LABELS if k in sample.labels), None)
            if replica is not None:
                mine = counts.setdefault(replica, dict.fromkeys(COUNTERS.values(), 0.0))
                mine[kind] += sample.value
    return counts


def spread(
    before: dict[str, dict[str, float]], after: dict[str, dict[str, float]]
) -> list[dict[str, Any]]:
    """Each replica's requests and rows during the run, and its share of the rows (a replica
    restarted in the run counts from zero again: its counts are what it had at the end)."""
    during = {}
    for replica, counts in after.items():
        old = before.get(replica, {})
        restarted = counts["requests"] < old.get("requests", 0.0)
        during[replica] = {k: v if restarted else v - old.get(k, 0.0) for k, v in counts.items()}
    rows = sum(d["rows"] for d in during.values())
    return [
        {"replica": r, "requests": int(d["requests"]), "rows": int(d["rows"]),
         "share": d["rows"] / rows if rows else 0.0}
        for r, d in sorted(during.items())
    ]  # fmt: skip


def lines(report: dict[str, Any]) -> list[str]:
    """The spread as lines for the console and the markdown report."""
    return [
        f"replica {r['replica']}: {r['requests']} requests, {r['rows']} rows ({r['share']:.1%})"
        for r in report.get("replicas") or []
    ]
