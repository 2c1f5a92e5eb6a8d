"""Autoscaling on the objective (scale/objective.py), in virtual time on pure figures: the wait
rises and replicas come, the fleet idles and they go after the delay, no flapping at the edge,
MIN and MAX hold, and a model without an objective follows its requests in flight."""

from __future__ import annotations

import math

from dlscale.scale.objective import (
    DOWN_DELAY_S,
    MAX_BUSY,
    UP_AT,
    Bounds,
    Decision,
    ModelLoad,
    decide,
)

OBJECTIVE_S = 0.020
BOUNDS = Bounds(1, 8, target_in_flight=4.0)


def _load(
    wait_s: float, busy: float, in_flight: float = 0.0, objective_s: float = OBJECTIVE_S
) -> ModelLoad:
    return ModelLoad("m", objective_s, rate=100.0, wait_s=wait_s, busy=busy, in_flight=in_flight)


def _mm1_load(rate: float, replicas: int, service_s: float = 0.004) -> ModelLoad:
    """The figures a fleet of M/M/1 replicas would report: each gets rate / replicas."""
    rho = rate * service_s / replicas
    wait = math.inf if rho >= 1 else service_s * rho / (1 - rho)
    return ModelLoad("m", OBJECTIVE_S, rate, wait, min(1.0, rho), 0.0)


def _run(rate: float, replicas: int, steps: int, bounds: Bounds = BOUNDS) -> list[Decision]:
    """The policy every 5 virtual seconds on a steady M/M/1 load, its replicas applied at once."""
    decisions, down_since = [], None
    for step in range(steps):
        d = decide([_mm1_load(rate, replicas)], replicas, replicas, bounds, 5.0 * step, down_since)
        decisions.append(d)
        replicas, down_since = d.replicas, d.down_since
    return decisions


def test_a_rising_wait_adds_replicas_at_once_with_the_figures_it_used() -> None:
    d = decide([_load(wait_s=UP_AT * OBJECTIVE_S, busy=0.6)], 2, 2, BOUNDS, now=0.0)
    assert d.replicas > 2
    assert d.figures["m.wait_ms"] == UP_AT * OBJECTIVE_S * 1e3
    assert d.figures["m.objective_ms"] == OBJECTIVE_S * 1e3
    assert "m: wait 10 ms" in d.reason and "would hold both" in d.reason


def test_a_saturated_fleet_at_most_doubles() -> None:
    d = decide([_load(wait_s=math.inf, busy=1.0)], 2, 2, BOUNDS, now=0.0)
    assert d.replicas == 4 and "doubled" in d.reason


def test_an_idle_fleet_sheds_a_replica_only_after_the_delay() -> None:
    idle = [_load(wait_s=0.0, busy=0.05)]
    first = decide(idle, 4, 4, BOUNDS, now=100.0)
    assert first.replicas == 4 and first.down_since == 100.0 and "held 0 of" in first.reason
    early = decide(idle, 4, 4, BOUNDS, now=100.0 + DOWN_DELAY_S - 1, down_since=first.down_since)
    assert early.replicas == 4
    late = decide(idle, 4, 4, BOUNDS, now=100.0 + DOWN_DELAY_S, down_since=first.down_since)
    assert late.replicas == 3 and late.down_since is None


def test_a_busy_moment_restarts_the_delay() -> None:
    held = decide([_load(0.0, 0.05)], 4, 4, BOUNDS, now=0.0)
    busy = decide([_load(0.004, 0.7)], 4, 4, BOUNDS, now=30.0, down_since=held.down_since)
    assert busy.replicas == 4 and busy.down_since is None
    again = decide([_load(0.0, 0.05)], 4, 4, BOUNDS, now=DOWN_DELAY_S, down_since=None)
    assert again.replicas == 4  # the delay counts from the idle that followed, not the first


def test_no_replica_goes_that_the_others_could_not_spare() -> None:
    # 4 replicas at 65% each: 3 would be at 87%, above MAX_BUSY, however long the wait is low.
    d = decide([_load(0.001, 0.65)], 4, 4, BOUNDS, now=1e6, down_since=0.0)
    assert MAX_BUSY < 0.65 * 4 / 3
    assert d.replicas == 4 and "not fewer" in d.reason


def test_a_steady_load_settles_and_stays_there() -> None:
    decisions = _run(rate=1000.0, replicas=1, steps=200)
    counts = [d.replicas for d in decisions]
    settled = counts[-1]
    # The fewest replicas that hold both the wait and the busy share, on this load.
    fewest = next(n for n in range(1, 9) if _holds(_mm1_load(1000.0, n)))
    assert settled == fewest
    # Up (doubling past saturation), then down a step per delay: never up again (no flapping).
    peak = counts.index(max(counts))
    assert counts[:peak] == sorted(counts[:peak])
    assert counts[peak:] == sorted(counts[peak:], reverse=True)
    assert counts[len(counts) // 2 :] == [settled] * (len(counts) - len(counts) // 2)


def _holds(load: ModelLoad) -> bool:
    return load.wait_s < UP_AT * load.objective_s and load.busy <= MAX_BUSY


def test_the_same_load_from_above_settles_on_the_same_count() -> None:
    from_below = _run(rate=1000.0, replicas=1, steps=200)[-1].replicas
    from_above = _run(rate=1000.0, replicas=8, steps=200)[-1].replicas
    assert from_above == from_below


def test_min_and_max_hold() -> None:
    tight = Bounds(2, 3)
    assert decide([_load(math.inf, 1.0)], 3, 3, tight, now=0.0).replicas == 3
    assert _run(rate=1.0, replicas=3, steps=100, bounds=tight)[-1].replicas == 2
    assert decide([_load(0.0, 0.0)], 5, 5, tight, now=0.0).replicas == 3  # above MAX: at once


def test_a_model_without_an_objective_follows_its_requests_in_flight() -> None:
    plain = _load(wait_s=1.0, busy=0.99, in_flight=17.0, objective_s=0.0)
    d = decide([plain], 2, 2, BOUNDS, now=0.0)
    assert d.replicas == 5 and "in flight 17 / 4 each" in d.reason  # ceil(17 / 4)


def test_the_model_that_wants_most_wins() -> None:
    plain = ModelLoad("p", 0.0, 10.0, 0.0, 0.1, in_flight=4.0)  # 1 replica would do
    slow = ModelLoad("s", OBJECTIVE_S, 100.0, OBJECTIVE_S, 0.9, 0.0)  # wants more
    d = decide([plain, slow], 2, 2, BOUNDS, now=0.0)
    assert d.replicas > 2 and d.reason.startswith("s:")


def test_no_replica_goes_while_others_start() -> None:
    d = decide([_load(0.0, 0.0)], 2, 4, BOUNDS, now=1e6, down_since=0.0)
    assert d.replicas == 4 and "starting" in d.reason
