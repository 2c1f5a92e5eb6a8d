"""`--autoscale MIN:MAX` on Ray Serve's autoscaler, by each model's objective or requests in flight.

Requests do not pass through Ray Serve, so its own count of ongoing requests is zero; instead
each replica reports its server's own figures (`record_autoscaling_stats`): per model, over the
interval since its last report, the requests answered per second, their mean queue wait, the
share of its capacity in use (that rate times the best time per row its batches measured, over
its instances), the requests it holds now and how fast they grew over the interval, its
capacity (its instances over that best time per row), for a generative model its mean time to
first token and per output token, and the model's objectives (`figures`, from the server's
`/v2/models/stats` and metrics page). `FleetPolicy`, a custom policy run by Ray Serve's
controller, hands them to the pure rule in scale/objective.py (models with an objective: queue
wait, TTFT and TPOT against them; without: `target_ongoing_requests` in flight per replica),
keeps the rule's state in Ray's policy state, logs every change of decision with the figures it
used, and tells the fleet's router actor, whose `/dlscale/fleet` view shows it. Ray's wrapper
applies MIN and MAX; its own delays are zero, the rule holds its own (`down_delay_s`).
"""

from __future__ import annotations

import concurrent.futures
import logging
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dlscale.scale.objective import DOWN_DELAY_S, Bounds, Decision, ModelLoad, decide
from dlscale.scale.placement import readable_configs
from dlscale.scale.starts import LOOK_BACK_S, Starts

log = logging.getLogger("dlscale.scale")

#: A model's figure, reported as f"{PREFIX}/{figure}/{model}" (a model name holds no "/").
PREFIX = "dlscale"
FIGURES = (
    "rate", "wait_s", "busy", "in_flight", "objective_s",
    "ttft_s", "tpot_s", "ttft_objective_s", "tpot_objective_s", "capacity", "growth",
)  # fmt: skip
#: Each fresh report's mark that it is one replica's (`figures`): Ray keeps a replica's figures
#: for its look-back window only, and one missing is a replica the rule cannot read.
REPORTED = f"{PREFIX}/replica"
#: Keys of the policy's state: when the fleet began wanting fewer, the last size that missed
#: its goals (and at what rate), when replicas were last seen starting, the scale-ups' timing
#: (scale/starts.py), and the last decision.
DOWN_SINCE, MISSED, LAST = "dlscale_down_since", "dlscale_missed", "dlscale_last"
JOINED, STARTS = "dlscale_joined", "dlscale_starts"
_PENDING = "nv_inference_pending_request_count"
_OBJECTIVE = "dlscale_qos_latency_objective_seconds"
_TTFT, _TPOT = "dlscale_time_to_first_token_seconds", "dlscale_time_per_output_token_seconds"
_TTFT_OBJECTIVE = "dlscale_qos_ttft_objective_seconds"
_TPOT_OBJECTIVE = "dlscale_qos_tpot_objective_seconds"


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

    requests: float = 0.0
    queue_s: float = 0.0
    #: The best mean time per row of a batch size measured so far, seconds (0: none yet).
    row_s: float = 0.0
    in_flight: float = 0.0
    objective_s: float = 0.0
    #: A generative model's TTFT and TPOT histograms: the sum of their observations (seconds)
    #: and their count.
    ttft: tuple[float, float] = (0.0, 0.0)
    tpot: tuple[float, float] = (0.0, 0.0)
    ttft_objective_s: float = 0.0
    tpot_objective_s: float = 0.0


@dataclass(frozen=True)
class Reading:
    """A replica's counters of every model, at a monotonic time in seconds."""

    at: float
    models: dict[str, Counters]


def read(at: float, stats: Mapping[str, Any], page: str) -> Reading:
    """A reading from a server's `/v2/models/stats` answer and its metrics page (every
    version of a model added up)."""
    pending, objective = _per_model(page, _PENDING), _per_model(page, _OBJECTIVE)
    ttft, tpot = _histogram(page, _TTFT), _histogram(page, _TPOT)
    ttft_objective = _per_model(page, _TTFT_OBJECTIVE)
    tpot_objective = _per_model(page, _TPOT_OBJECTIVE)
    sums: dict[str, list[float]] = {}
    for entry in stats.get("model_stats", []):
        infer = entry.get("inference_stats", {})
        row = sums.setdefault(entry["name"], [0.0, 0.0, 0.0])
        row[0] += float(infer.get("success", {}).get("count", 0))
        row[1] += float(infer.get("queue", {}).get("ns", 0)) / 1e9
        row[2] = _best_row_s(entry.get("batch_stats", []), row[2])
    models = {
        m: Counters(
            r, q, b, pending.get(m, 0.0), objective.get(m, 0.0),
            ttft.get(m, (0.0, 0.0)), tpot.get(m, (0.0, 0.0)),
            ttft_objective.get(m, 0.0), tpot_objective.get(m, 0.0),
        )
        for m, (r, q, b) in sums.items()
    }  # fmt: skip
    return Reading(at, models)


def _histogram(page: str, name: str) -> dict[str, tuple[float, float]]:
    """A histogram's sum and count per model: their differences over an interval give its
    mean, exactly, where a p99 read from the buckets would be off by up to a bucket's width."""
    sums, counts = _per_model(page, f"{name}_sum"), _per_model(page, f"{name}_count")
    return {m: (sums[m], counts.get(m, 0.0)) for m in sums}


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
    if span <= 0:
        return {}
    report = {REPORTED: 1.0}
    for model, now in after.models.items():
        then = before.models.get(model, Counters())
        answered = now.requests - then.requests
        wait = (now.queue_s - then.queue_s) / answered if answered > 0 else 0.0
        rate = answered / span
        count = max(1, instances.get(model, 1))
        busy = rate * now.row_s / count
        capacity = count / now.row_s if now.row_s > 0 else 0.0
        values = (
            rate, wait, min(1.0, busy), now.in_flight, now.objective_s,
            _mean(then.ttft, now.ttft), _mean(then.tpot, now.tpot),
            now.ttft_objective_s, now.tpot_objective_s,
            capacity, (now.in_flight - then.in_flight) / span,
        )  # fmt: skip
        report |= {f"{PREFIX}/{f}/{model}": v for f, v in zip(FIGURES, values, strict=True)}
    return report


def _mean(then: tuple[float, float], now: tuple[float, float]) -> float:
    """The mean of a histogram's observations between two readings (0: none)."""
    count = now[1] - then[1]
    return (now[0] - then[0]) / count if count > 0 else 0.0


def loads(per_replica: Mapping[str, Mapping[Any, float]]) -> list[ModelLoad]:
    """Each model's fleet-wide load from the replicas' reports (Ray's aggregated metrics):
    rates, in flight and its growth added, the wait weighted by each replica's rate, the
    capacity the best any replica measured, and busy the replicas' mean share of it."""
    by_model: dict[str, dict[str, dict[Any, float]]] = {}
    for key, values in per_replica.items():
        prefix, _, rest = key.partition("/")
        figure, _, model = rest.partition("/")
        if prefix == PREFIX and figure in FIGURES and model:
            by_model.setdefault(model, {})[figure] = dict(values)
    return [_load(model, f) for model, f in sorted(by_model.items())]


def reporting(per_replica: Mapping[str, Mapping[Any, float]]) -> int:
    """How many replicas' figures Ray's aggregate holds (each fresh report is marked)."""
    return len(per_replica.get(REPORTED, {}))


def _load(model: str, f: Mapping[str, Mapping[Any, float]]) -> ModelLoad:
    rates = f.get("rate", {})
    capacity = best_capacity(f.get("capacity", {}))
    fleet = {x: sum(f.get(x, {}).values()) for x in ("rate", "in_flight", "growth")}
    objectives = ("objective_s", "ttft_objective_s", "tpot_objective_s")
    fleet |= {x: max(f.get(x, {}).values(), default=0.0) for x in objectives}
    fleet |= {x: _weighted(f.get(x, {}), rates) for x in ("wait_s", "ttft_s", "tpot_s")}
    busy = _busy(f.get("busy", {}), rates, capacity)
    return ModelLoad(model, busy=busy, capacity=capacity, **fleet)


def best_capacity(capacities: Mapping[Any, float]) -> float:
    """A replica's capacity for the fleet: the best any replica measured (0: none did).

    Every replica runs the same model, and each measures its best time per row over the batch
    sizes it has run: a replica that joined in a burst's first seconds has run batches of one
    and reads half a full batch's rate. The replicas' mean let it lower the fleet's, and the
    rule asked for replicas the demand did not need (BENCHMARKS.md, run 5 of the burst)."""
    return max((c for c in capacities.values() if c > 0), default=0.0)


def _busy(busy: Mapping[Any, float], rates: Mapping[Any, float], capacity: float) -> float:
    """The replicas' mean busy share: each one's rate over the fleet's capacity where one was
    measured (the same warming replica overstated its own), else as each reported."""
    if capacity > 0:
        shares = [min(1.0, rates.get(r, 0.0) / capacity) for r in busy]
    else:
        shares = list(busy.values())
    return sum(shares) / len(shares) if shares else 0.0


def _weighted(means: Mapping[Any, float], rates: Mapping[Any, float]) -> float:
    """The fleet's mean of the replicas' means, each weighted by its rate (the worst when none
    answered: figures from before the interval still say something)."""
    rate = sum(rates.values())
    if rate > 0:
        return sum(means.get(r, 0.0) * v for r, v in rates.items()) / rate
    return max(means.values(), default=0.0)


def _policy(ctx: Any, down_delay_s: float) -> tuple[Decision, dict[str, Any], bool]:
    """scale/objective.py's decision on the replicas' reports, the policy's state to keep, and
    whether the decision was logged (with its figures, whenever it changes the replicas or
    starts holding them)."""
    state = dict(ctx.policy_state or {})
    bounds = Bounds(
        ctx.capacity_adjusted_min_replicas,
        ctx.capacity_adjusted_max_replicas,
        float(ctx.config.target_ongoing_requests or 1.0),
    )
    metrics = ctx.aggregated_metrics or {}
    decision = decide(
        loads(metrics), ctx.current_num_replicas, ctx.target_num_replicas,
        bounds, ctx.current_time or time.time(), state.get(DOWN_SINCE), down_delay_s,
        _missed(state.get(MISSED)), state.get(JOINED), Starts.from_kept(state.get(STARTS)),
        reporting(metrics),
    )  # fmt: skip
    # The policy runs ten times a second: a line per change, not per run: the replicas change,
    # a hold begins, or a hold ends without its scale-down (the line says why the fleet kept
    # its replicas: without it a hold begun again and again read as a scale-down never done).
    began = decision.down_since is not None and state.get(DOWN_SINCE) is None
    broke = decision.down_since is None and state.get(DOWN_SINCE) is not None
    logged = decision.replicas != decision.target or began or broke
    if logged:
        log.info("autoscaler: %s", describe(decision))
    state[DOWN_SINCE], state[LAST] = decision.down_since, describe(decision)
    state[JOINED], state[STARTS] = decision.joined, decision.starts.kept()
    state[MISSED] = None if decision.missed is None else list(decision.missed)
    return decision, state, logged


def _missed(kept: Any) -> tuple[int, float] | None:
    """The missed size and rate as the policy's state keeps them (a list, or None)."""
    return None if kept is None else (int(kept[0]), float(kept[1]))


class FleetPolicy:
    """The fleet's policy as Ray Serve's controller runs it (a class: Ray makes one there, with
    `policy_kwargs`): `_policy` with the fleet's down delay, and each decision it logs told
    to the router actor (named `router` in `namespace`) for its `/dlscale/fleet` view.

    The controller runs every deployment's policy on its own loop: a call to the router there
    could hold it (a lookup, a restarting actor). The telling runs on a thread of this policy's
    own and waits for no answer; a decision it could not tell is left out of the view, not
    retried (the next one replaces it, and the controller's log keeps every one).
    """

    def __init__(
        self, down_delay_s: float = DOWN_DELAY_S, router: str = "", namespace: str = ""
    ) -> None:
        self.down_delay_s = down_delay_s
        self.router, self.namespace = router, namespace
        if router:  # in Ray Serve's controller (not a test calling it)
            _log_to_stderr()
        self._told = False
        self._teller: concurrent.futures.ThreadPoolExecutor | None = None
        self._handle: Any = None

    def __call__(self, ctx: Any) -> tuple[int, dict[str, Any]]:
        """One run of the policy: the replicas wanted and the state to keep."""
        decision, state, logged = _policy(ctx, self.down_delay_s)
        if self.router and (logged or not self._told):
            self._told = True
            if self._teller is None:
                self._teller = concurrent.futures.ThreadPoolExecutor(1, "dlscale-autoscaler")
            self._teller.submit(self._tell, decided(decision, time.time()))
        return decision.replicas, state

    def _tell(self, said: dict[str, Any]) -> None:
        import ray  # the [ray] extra: present wherever Ray Serve runs this policy

        try:
            if self._handle is None:
                self._handle = ray.get_actor(self.router, namespace=self.namespace)
            self._handle.decided.remote(said)  # no wait for its answer
        except Exception as exc:  # no router (yet, or restarting): the next decision tries
            self._handle = None
            log.info("autoscaler: the router did not hear the decision (%s)", exc)


def _log_to_stderr() -> None:
    """The decisions in the controller's own log file (its stderr, `worker-*.err` of the
    ServeController actor in Ray's session logs): the fleet keeps Ray Serve's own logger at
    WARNING, and `dlscale.scale` has no handler in that process. Once per process: each
    deploy makes a new policy there."""
    if any(getattr(h, "name", "") == _HANDLER for h in log.handlers):
        return
    handler = logging.StreamHandler()
    handler.set_name(_HANDLER)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    log.addHandler(handler)
    log.setLevel(logging.INFO)


_HANDLER = "dlscale-autoscaler"


def decided(decision: Decision, at: float) -> dict[str, Any]:
    """A decision as the fleet's view shows it: the replicas before and after, the log line, and
    when (Unix time)."""
    return {
        "at": at,
        "target": decision.target,
        "replicas": decision.replicas,
        "line": describe(decision),
    }


def describe(decision: Decision) -> str:
    """A decision as one log line: replicas wanted, why, and the figures it used."""
    figures = " ".join(f"{k}={_short(v)}" for k, v in decision.figures.items())
    return f"{decision.target} -> {decision.replicas} replicas: {decision.reason} [{figures}]"


def _short(value: float) -> str:
    return "inf" if math.isinf(value) else f"{value:.4g}"


def autoscaling_config(
    low: int,
    high: int,
    target: float,
    down_delay_s: float = DOWN_DELAY_S,
    router: tuple[str, str] = ("", ""),
) -> dict[str, Any]:
    """Ray Serve's `autoscaling_config` of the fleet's deployment; `router` (name, namespace):
    the router actor told of each decision."""
    kwargs = {"down_delay_s": down_delay_s, "router": router[0], "namespace": router[1]}
    return {
        "min_replicas": low,
        "max_replicas": high,
        "target_ongoing_requests": target,
        "metrics_interval_s": 1.0,
        "look_back_period_s": LOOK_BACK_S,
        # The rule holds its own delay down (`down_delay_s`); up it follows the
        # replicas' figures, already a mean over look_back_period_s.
        "upscale_delay_s": 0.0,
        "downscale_delay_s": 0.0,
        "policy": {"policy_function": FleetPolicy, "policy_kwargs": kwargs},
    }


def instances(repository: Path, names: Sequence[str]) -> dict[str, int]:
    """Each model's instances, from its config in the repository (1 where it cannot be read)."""
    read = readable_configs(repository, names)
    return {n: max(1, sum(g.count for g in read[n].instances)) if n in read else 1 for n in names}
