"""`--autoscale MIN:MAX` on Ray Serve's autoscaler, by each model's objective or requests in flight.

Requests do not pass through Ray Serve, so its own count of ongoing requests is zero; instead
each replica reports its server's own figures (`record_autoscaling_stats`): per model, over the
interval since its last report, the requests answered per second, their mean queue wait, the
share of its capacity in use (that rate times the best time per row its batches measured, over
its instances), the requests it holds now and the model's
objective (`figures`, from the server's `/v2/models/stats` and metrics page). `fleet_policy`, a
custom policy run by Ray Serve's controller, hands them to the pure rule in scale/objective.py
(models with an objective: queue wait against it; without: `target_ongoing_requests` in flight
per replica), keeps the rule's state in Ray's policy state, and logs every change of decision
with the figures it used. Ray's wrapper applies MIN and MAX; its own delays are zero, the rule
holds its own (objective.DOWN_DELAY_S).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dlscale.errors import DlscaleError
from dlscale.models.repository import ModelRepository
from dlscale.scale.objective import Bounds, Decision, ModelLoad, decide

log = logging.getLogger("dlscale.scale")

#: A model's figure, reported as f"{PREFIX}/{figure}/{model}" (a model name holds no "/").
PREFIX = "dlscale"
FIGURES = ("rate", "wait_s", "busy", "in_flight", "objective_s")
#: Keys of the policy's state: when the fleet began wanting fewer, and the last decision.
DOWN_SINCE, LAST = "dlscale_down_since", "dlscale_last"
_PENDING = "nv_inference_pending_request_count"
_OBJECTIVE = "dlscale_qos_latency_objective_seconds"


def _per_model(page: str, name: str) -> dict[str, float]:
    """One family's samples of a Prometheus page, added up per `model` label."""
    found: dict[str, float] = {}
    for line in page.splitlines():
        if not line.startswith((f"{name}{{", f"{name} ")):
            continue
        labels, _, value = line.rpartition(" ")
        model = labels.partition('model="')[2].partition('"')[0]
        found[model] = found.get(model, 0.0) + float(value)
    return found


@dataclass(frozen=True)
class Counters:
    """What a server counted for one model since it loaded it, and what it holds now."""

    requests: float
    queue_s: float
    #: The best mean time per row of a batch size measured so far, seconds (0: none yet).
    row_s: float
    in_flight: float
    objective_s: float


@dataclass(frozen=True)
class Reading:
    """A replica's counters of every model, at a monotonic time in seconds."""

    at: float
    models: dict[str, Counters]


def read(at: float, stats: Mapping[str, Any], page: str) -> Reading:
    """A reading from a server's `/v2/models/stats` answer and its metrics page (every
    version of a model added up)."""
    pending, objective = _per_model(page, _PENDING), _per_model(page, _OBJECTIVE)
    sums: dict[str, list[float]] = {}
    for entry in stats.get("model_stats", []):
        infer = entry.get("inference_stats", {})
        row = sums.setdefault(entry["name"], [0.0, 0.0, 0.0])
        row[0] += float(infer.get("success", {}).get("count", 0))
        row[1] += float(infer.get("queue", {}).get("ns", 0)) / 1e9
        row[2] = _best_row_s(entry.get("batch_stats", []), row[2])
    models = {
        m: Counters(r, q, b, pending.get(m, 0.0), objective.get(m, 0.0))
        for m, (r, q, b) in sums.items()
    }
    return Reading(at, models)


def _best_row_s(batches: Sequence[Mapping[str, Any]], best: float) -> float:
    """The least mean compute time per row over the batch sizes run (`best` if fewer)."""
    for b in batches:
        count = float(b["compute_infer"].get("count", 0))
        if count > 0:
            per_row = float(b["compute_infer"]["ns"]) / count / float(b["batch_size"]) / 1e9
            best = per_row if best <= 0 else min(best, per_row)
    return best


def figures(before: Reading, after: Reading, instances: Mapping[str, int]) -> dict[str, float]:
    """A replica's report: each model's figures over the interval between two readings."""
    span = after.at - before.at
    report: dict[str, float] = {}
    if span <= 0:
        return report
    for model, now in after.models.items():
        then = before.models.get(model, Counters(0.0, 0.0, 0.0, 0.0, 0.0))
        answered = now.requests - then.requests
        wait = (now.queue_s - then.queue_s) / answered if answered > 0 else 0.0
        rate = answered / span
        busy = rate * now.row_s / max(1, instances.get(model, 1))
        values = (rate, wait, min(1.0, busy), now.in_flight, now.objective_s)
        report |= {f"{PREFIX}/{f}/{model}": v for f, v in zip(FIGURES, values, strict=True)}
    return report


def loads(per_replica: Mapping[str, Mapping[Any, float]]) -> list[ModelLoad]:
    """Each model's fleet-wide load from the replicas' reports (Ray's aggregated metrics):
    rates and in flight added, the wait weighted by each replica's rate, busy the mean."""
    by_model: dict[str, dict[str, dict[Any, float]]] = {}
    for key, values in per_replica.items():
        prefix, _, rest = key.partition("/")
        figure, _, model = rest.partition("/")
        if prefix == PREFIX and figure in FIGURES and model:
            by_model.setdefault(model, {})[figure] = dict(values)
    return [_load(model, f) for model, f in sorted(by_model.items())]


def _load(model: str, f: Mapping[str, Mapping[Any, float]]) -> ModelLoad:
    rates = f.get("rate", {})
    rate = sum(rates.values())
    waits = f.get("wait_s", {})
    if rate > 0:
        wait = sum(waits.get(r, 0.0) * v for r, v in rates.items()) / rate
    else:
        wait = max(waits.values(), default=0.0)
    busy = list(f.get("busy", {}).values())
    return ModelLoad(
        model,
        objective_s=max(f.get("objective_s", {}).values(), default=0.0),
        rate=rate,
        wait_s=wait,
        busy=sum(busy) / len(busy) if busy else 0.0,
        in_flight=sum(f.get("in_flight", {}).values()),
    )


def fleet_policy(ctx: Any) -> tuple[int, dict[str, Any]]:
    """Ray Serve's custom policy: scale/objective.py's decision on the replicas' reports,
    logged with its figures whenever it changes the replicas or starts holding them."""
    state = dict(ctx.policy_state or {})
    bounds = Bounds(
        ctx.capacity_adjusted_min_replicas,
        ctx.capacity_adjusted_max_replicas,
        float(ctx.config.target_ongoing_requests or 1.0),
    )
    decision = decide(
        loads(ctx.aggregated_metrics or {}), ctx.current_num_replicas, ctx.target_num_replicas,
        bounds, ctx.current_time or time.time(), state.get(DOWN_SINCE),
    )  # fmt: skip
    # The policy runs ten times a second: a line per change, not per run.
    held = decision.down_since is not None and state.get(DOWN_SINCE) is None
    if decision.replicas != decision.target or held:
        log.info("autoscaler: %s", describe(decision))
    state[DOWN_SINCE], state[LAST] = decision.down_since, describe(decision)
    return decision.replicas, state


def describe(decision: Decision) -> str:
    """A decision as one log line: replicas wanted, why, and the figures it used."""
    figures = " ".join(f"{k}={_short(v)}" for k, v in decision.figures.items())
    return f"{decision.target} -> {decision.replicas} replicas: {decision.reason} [{figures}]"


def _short(value: float) -> str:
    return "inf" if math.isinf(value) else f"{value:.4g}"


def autoscaling_config(low: int, high: int, target: float) -> dict[str, Any]:
    """Ray Serve's `autoscaling_config` of the fleet's deployment."""
    return {
        "min_replicas": low,
        "max_replicas": high,
        "target_ongoing_requests": target,
        "metrics_interval_s": 1.0,
        "look_back_period_s": 5.0,
        # The rule holds its own delay down (objective.DOWN_DELAY_S); up it follows the
        # replicas' figures, already a mean over look_back_period_s.
        "upscale_delay_s": 0.0,
        "downscale_delay_s": 0.0,
        "policy": {"policy_function": fleet_policy},
    }


def instances(repository: Path, names: Sequence[str]) -> dict[str, int]:
    """Each model's instances, from its config in the repository (1 where it cannot be read)."""
    found = {}
    for name in names:
        try:
            config = ModelRepository(repository).source(name).config
        except DlscaleError:
            found[name] = 1
            continue
        found[name] = max(1, sum(g.count for g in config.instances))
    return found
