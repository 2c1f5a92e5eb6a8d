"""Autoscaling on the objective: the replicas a fleet wants, from each model's measured queue wait.

A pure function of figures and a clock (no Ray here: scale/autoscale.py feeds it from the
replicas' reports and keeps its state in Ray's policy state). For each model with an objective
(`[qos] latency_objective_us`, the p99 of its time in the server) the fleet's mean queue wait
over the last interval is held under UP_AT of it, and each replica's busy share (its rate over
its capacity) at most MAX_BUSY: when either is crossed, replicas are added, as many as an M/M/1
estimate says bring both back (at most twice as many); a replica is removed only when the same
estimate says the others would hold both, and the fleet wanted fewer replicas for DOWN_DELAY_S
without a break. Models without an objective keep the
in-flight rule: a replica per `target_in_flight` requests held. The fleet follows the model that
wants the most. docs/scale.md, "Autoscaling on the objective".
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

#: Replicas are added when a model's mean queue wait reaches this share of its objective: the
#: rest of the objective is its compute and the tail above the mean.
UP_AT = 0.5
#: A replica goes only if the others would then compute at most this share of the time: past
#: it the estimate below says little, and a burst finds no room.
MAX_BUSY = 0.8
#: Seconds the fleet must want fewer replicas, without a break, before one goes.
DOWN_DELAY_S = 60.0
#: Busy shares are read no higher than this: a saturated fleet's estimate stays finite.
_BUSY_CAP = 0.95


@dataclass(frozen=True)
class ModelLoad:
    """One model's figures over the last interval, for the whole fleet."""

    model: str
    #: The p99 of a request's time in the server to hold, seconds; 0: none declared.
    objective_s: float
    #: Requests answered per second (all replicas).
    rate: float
    #: Their mean time in the queue, seconds.
    wait_s: float
    #: The mean share of a replica's capacity in use: its rate times its best measured time
    #: per row, over its instances (0 to 1; the planner's utilization, plan/queueing.py).
    busy: float
    #: Requests queued or computing now (all replicas).
    in_flight: float


@dataclass(frozen=True)
class Bounds:
    """MIN and MAX replicas, and the in-flight target of models without an objective."""

    low: int
    high: int
    target_in_flight: float = 1.0


@dataclass(frozen=True)
class Decision:
    """Replicas wanted, the figures it used and why; `down_since` is the state to keep."""

    replicas: int
    #: The replicas Ray aimed at before this decision.
    target: int
    reason: str
    figures: dict[str, float]
    #: When the fleet began wanting fewer replicas (None: it does not).
    down_since: float | None = None


def predicted_wait(load: ModelLoad, current: int, replicas: int) -> float:
    """The mean wait with `replicas` sharing the load `current` carry now (M/M/1's growth of
    the wait with the busy share, scaled from the measured wait); inf past saturation."""
    busy = min(load.busy, _BUSY_CAP)
    after = busy * current / replicas
    if after >= 1.0:
        return math.inf
    if busy <= 0.0:
        return load.wait_s

    def growth(rho: float) -> float:
        return rho / (1.0 - rho)

    return load.wait_s * growth(after) / growth(busy)


def objective_wants(load: ModelLoad, current: int, bounds: Bounds) -> tuple[int, str]:
    """Replicas one model with an objective wants, and why: the fewest the estimate says keep
    its wait under UP_AT of the objective and each replica no busier than MAX_BUSY."""
    threshold = UP_AT * load.objective_s
    wait, goal = _ms(load.wait_s), _ms(threshold)

    def holds(n: int) -> bool:
        return predicted_wait(load, current, n) < threshold and load.busy * current / n <= MAX_BUSY

    if load.wait_s >= threshold or load.busy > MAX_BUSY:
        now = (
            f"{load.model}: wait {wait} (goal < {goal}), busy {load.busy:.2f} (goal <= {MAX_BUSY})"
        )
        # At most double at once: a saturated fleet's figures say how far behind it is, not
        # how many replicas the demand needs.
        top = min(bounds.high, 2 * current)
        for n in range(current + 1, top + 1):
            if holds(n):
                return n, f"{now}; {n} would hold both"
        return max(top, current + 1), f"{now}; doubled"
    fewer = current - 1
    if fewer < max(1, bounds.low):
        return current, f"{load.model}: wait {wait} < {goal} at MIN"
    after, busy = predicted_wait(load, current, fewer), load.busy * current / fewer
    figures = (
        f"{fewer} would wait {_ms(after)} (goal < {goal}), busy {busy:.2f} (goal <= {MAX_BUSY})"
    )
    if holds(fewer):
        return fewer, f"{load.model}: {figures}"
    return current, f"{load.model}: wait {wait} < {goal}; not fewer: {figures}"


def in_flight_wants(loads: Sequence[ModelLoad], bounds: Bounds) -> tuple[int, str]:
    """Replicas the models without an objective want: one per `target_in_flight` held."""
    held = sum(load.in_flight for load in loads)
    wanted = max(1, math.ceil(held / bounds.target_in_flight))
    return wanted, f"in flight {held:g} / {bounds.target_in_flight:g} each"


def decide(
    loads: Sequence[ModelLoad],
    running: int,
    target: int,
    bounds: Bounds,
    now: float,
    down_since: float | None = None,
) -> Decision:
    """Replicas wanted now: the most any model wants (estimated from the `running` replicas'
    figures), within MIN and MAX; fewer than `target` only after DOWN_DELAY_S of wanting fewer
    (`down_since`, from the previous decision), and never while replicas start."""
    running = max(1, running)
    wants = [objective_wants(x, running, bounds) for x in loads if x.objective_s > 0]
    plain = [x for x in loads if x.objective_s <= 0]
    if plain or not wants:
        wants.append(in_flight_wants(plain, bounds))
    wanted, why = max(wants, key=lambda w: w[0])
    wanted = min(max(wanted, bounds.low), bounds.high)
    figures = _figures(loads, running, target)
    if wanted >= target or target > bounds.high:
        return Decision(wanted, target, why, figures)
    if running < target:  # the figures predate the replicas still starting
        return Decision(target, target, f"{why}; {target - running} replica(s) starting", figures)
    since = now if down_since is None else down_since
    if now - since < DOWN_DELAY_S:
        held = f"{why}; held {now - since:.0f} of {DOWN_DELAY_S:g} s"
        return Decision(target, target, held, figures, since)
    return Decision(wanted, target, why, figures)


def _figures(loads: Sequence[ModelLoad], running: int, target: int) -> dict[str, float]:
    figures: dict[str, float] = {"running": float(running), "target": float(target)}
    for x in loads:
        figures |= {
            f"{x.model}.objective_ms": x.objective_s * 1e3,
            f"{x.model}.wait_ms": x.wait_s * 1e3,
            f"{x.model}.rate": x.rate,
            f"{x.model}.busy": x.busy,
            f"{x.model}.in_flight": x.in_flight,
        }
    return figures


def _ms(seconds: float) -> str:
    return "inf" if math.isinf(seconds) else f"{seconds * 1e3:.3g} ms"
