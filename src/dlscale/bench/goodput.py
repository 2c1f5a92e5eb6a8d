"""Goodput of a replayed load, on one time axis with the fleet's replicas (pure functions).

Goodput is the requests answered within their model's objective, per second of the run and per
replica-second: the fleet's replica count, a step function sampled during the run, integrated
over the run. Beside it: latency percentiles per tenant, errors by kind, each replica's load per
interval, the scaling events, and a per-bin timeline for the plot. docs/bench.md.
"""

from __future__ import annotations

import itertools
import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from dlscale.bench.latency import summarize


@dataclass(frozen=True)
class Outcome:
    """One request of the load: when it was meant to go and went, and how it ended."""

    offset_s: float
    sent_s: float
    model: str
    tenant: str
    #: Seconds from sending to the answer; None when it failed.
    latency_s: float | None
    #: The kind of failure (`http_503`, `connection`, `timeout`, ...); "" when answered.
    error: str = ""


@dataclass(frozen=True)
class FleetSample:
    """The fleet at one moment: replicas serving, and each replica's requests answered so far."""

    at_s: float
    replicas: int
    answered: dict[str, float] = field(default_factory=dict)


def replica_seconds(samples: Sequence[FleetSample], start_s: float, end_s: float) -> float:
    """The replica count integrated over [start_s, end_s]: each sample's count holds until the
    next sample (the first one's also before it)."""
    if end_s <= start_s or not samples:
        return 0.0
    ordered = sorted(samples, key=lambda s: s.at_s)
    total = 0.0
    for i, s in enumerate(ordered):
        since = start_s if i == 0 else max(start_s, s.at_s)
        until = end_s if i + 1 == len(ordered) else min(end_s, ordered[i + 1].at_s)
        total += s.replicas * max(0.0, until - since)
    return total


def scaling_events(samples: Sequence[FleetSample]) -> list[dict[str, float]]:
    """Each change of the replica count: when it was seen, from how many, to how many."""
    events: list[dict[str, float]] = []
    ordered = sorted(samples, key=lambda s: s.at_s)
    for before, after in itertools.pairwise(ordered):
        if after.replicas != before.replicas:
            events.append({"t_s": after.at_s, "from": before.replicas, "to": after.replicas})
    return events


def good(outcome: Outcome, objectives: Mapping[str, float]) -> bool:
    """Answered within its model's objective."""
    latency = outcome.latency_s
    return latency is not None and latency <= objectives[outcome.model]


def goodput(
    outcomes: Sequence[Outcome],
    objectives: Mapping[str, float],
    duration_s: float,
    replica_s: float | None,
) -> dict[str, Any]:
    """Requests sent, answered, within the objective; goodput per second and per replica-second
    (None without the fleet's replica count)."""
    within = sum(good(o, objectives) for o in outcomes)
    return {
        "sent": len(outcomes),
        "answered": sum(o.latency_s is not None for o in outcomes),
        "within_objective": within,
        "duration_s": duration_s,
        "goodput_per_s": within / duration_s if duration_s > 0 else None,
        "replica_seconds": replica_s,
        "goodput_per_replica_s": within / replica_s if replica_s else None,
        "objectives_s": dict(objectives),
    }


def by_tenant(outcomes: Sequence[Outcome], objectives: Mapping[str, float]) -> dict[str, Any]:
    """Each tenant's requests, answered, within the objective, and latency percentiles."""
    out: dict[str, Any] = {}
    for tenant in sorted({o.tenant for o in outcomes}):
        mine = [o for o in outcomes if o.tenant == tenant]
        latencies = [int(o.latency_s * 1e9) for o in mine if o.latency_s is not None]
        out[tenant] = {
            "sent": len(mine),
            "answered": len(latencies),
            "within_objective": sum(good(o, objectives) for o in mine),
            "latency_s": summarize(latencies),
        }
    return out


def errors_by_kind(outcomes: Sequence[Outcome]) -> dict[str, int]:
    """Failed requests counted by kind."""
    return dict(sorted(Counter(o.error for o in outcomes if o.error).items()))


def replica_load(samples: Sequence[FleetSample]) -> list[dict[str, Any]]:
    """Each replica's answers per second between two samples (a replica restarted in between
    counts from zero), with the sample times: the load each replica carried, over time."""
    ordered = sorted(samples, key=lambda s: s.at_s)
    out: list[dict[str, Any]] = []
    for before, after in itertools.pairwise(ordered):
        span = after.at_s - before.at_s
        if span <= 0:
            continue
        rates = {}
        for replica, count in after.answered.items():
            old = before.answered.get(replica, 0.0)
            rates[replica] = (count - old if count >= old else count) / span
        out.append({"t_s": after.at_s, "per_s": rates})
    return out


def timeline(
    outcomes: Sequence[Outcome],
    samples: Sequence[FleetSample],
    objectives: Mapping[str, float],
    bin_s: float = 1.0,
) -> list[dict[str, Any]]:
    """Per bin of `bin_s` seconds (by the time a request was sent): sent, answered, within the
    objective, failed, the p99 latency, and the replicas serving at the bin's start."""
    end = max((o.sent_s for o in outcomes), default=0.0)
    bins = max(1, math.ceil((end + 1e-9) / bin_s))
    rows: list[dict[str, Any]] = []
    grouped: list[list[Outcome]] = [[] for _ in range(bins)]
    for o in outcomes:
        grouped[min(bins - 1, int(o.sent_s // bin_s))].append(o)
    ordered = sorted(samples, key=lambda s: s.at_s)
    for i, mine in enumerate(grouped):
        latencies = [int(o.latency_s * 1e9) for o in mine if o.latency_s is not None]
        rows.append({
            "t_s": i * bin_s,
            "sent": len(mine),
            "answered": len(latencies),
            "within_objective": sum(good(o, objectives) for o in mine),
            "errors": sum(bool(o.error) for o in mine),
            "p99_s": summarize(latencies)["p99"],
            "replicas": _replicas_at(ordered, i * bin_s),
        })  # fmt: skip
    return rows


def _replicas_at(ordered: Sequence[FleetSample], t: float) -> int | None:
    """The count of the last sample at or before `t` (the first one's before any)."""
    if not ordered:
        return None
    found = ordered[0].replicas
    for s in ordered:
        if s.at_s > t:
            break
        found = s.replicas
    return found
