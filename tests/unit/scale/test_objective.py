"""Autoscaling on the objective (scale/objective.py), in virtual time on pure figures: the wait
rises and replicas come, the fleet idles and they go after the delay, no flapping at the edge,
MIN and MAX hold, and a model without an objective follows its requests in flight."""

from __future__ import annotations

import dataclasses
import math

from dlscale.scale.objective import (
    DOWN_DELAY_S,
    MAX_BUSY,
    MISSED_RATE_SHARE,
    TPOT_UP_AT,
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
    decisions, down_since, missed = [], None, None
    for step in range(steps):
        load = [_mm1_load(rate, replicas)]
        d = decide(load, replicas, replicas, bounds, 5.0 * step, down_since, missed=missed)
        decisions.append(d)
        replicas, down_since, missed = d.replicas, d.down_since, d.missed
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


# -- generative models: TTFT and TPOT objectives ---------------------------------------------

TTFT_OBJECTIVE_S, TPOT_OBJECTIVE_S = 0.500, 0.050


def _tokens(ttft_s: float, tpot_s: float, busy: float = 0.0, **objectives: float) -> ModelLoad:
    """A generative model's recorded figures (its busy share is 0: an engine runs no batches
    the batcher times), with both objectives unless told otherwise."""
    declared = {"ttft_objective_s": TTFT_OBJECTIVE_S, "tpot_objective_s": TPOT_OBJECTIVE_S}
    return ModelLoad(
        "g", 0.0, rate=20.0, wait_s=0.0, busy=busy, in_flight=6.0,
        ttft_s=ttft_s, tpot_s=tpot_s, **(declared | objectives),
    )  # fmt: skip


def test_a_ttft_near_its_objective_adds_replicas_naming_the_figures() -> None:
    # Queueing for sequence slots shows in TTFT: its mean at 0.6 of the p99 objective.
    d = decide([_tokens(ttft_s=0.300, tpot_s=0.010)], 2, 2, BOUNDS, now=0.0)
    assert d.replicas == 3  # 300 ms x 2 / 3 = 200 ms, under 250
    assert d.reason.startswith("g: TTFT 300 ms (goal < 250 ms), TPOT 10 ms (goal < 40 ms)")
    assert "3 would hold all" in d.reason
    assert d.figures["g.ttft_ms"] == 300 and d.figures["g.ttft_objective_ms"] == 500
    assert d.figures["g.tpot_ms"] == 10 and d.figures["g.tpot_objective_ms"] == 50


def test_a_tpot_near_its_objective_adds_replicas() -> None:
    # The decode batch is too large: TPOT at 0.9 of its objective, TTFT well within its own.
    d = decide([_tokens(ttft_s=0.050, tpot_s=0.045)], 2, 2, BOUNDS, now=0.0)
    assert d.replicas == 3 and "TPOT 45 ms (goal < 40 ms)" in d.reason


def test_only_a_tpot_objective_is_followed_alone() -> None:
    d = decide([_tokens(ttft_s=5.0, tpot_s=0.045, ttft_objective_s=0.0)], 2, 2, BOUNDS, now=0.0)
    assert d.replicas == 3 and "TTFT" not in d.reason and "TPOT 45 ms" in d.reason


def test_a_fleet_whose_fewer_replicas_would_miss_a_token_objective_holds() -> None:
    # Within both at 2 replicas; on 1, TTFT would be 2 x 200 ms, above 250: kept however long.
    d = decide([_tokens(ttft_s=0.200, tpot_s=0.010)], 2, 2, BOUNDS, now=1e6, down_since=0.0)
    assert d.replicas == 2
    assert d.reason == (
        "g: TTFT 200 ms < 250 ms, TPOT 10 ms < 40 ms; not fewer: 1 would: TTFT 400 ms "
        "(goal < 250 ms), TPOT 20 ms (goal < 40 ms), busy 0.00 (goal <= 0.8)"
    )


def test_a_quiet_generative_fleet_sheds_a_replica_after_the_delay() -> None:
    quiet = [_tokens(ttft_s=0.050, tpot_s=0.010)]
    first = decide(quiet, 3, 3, BOUNDS, now=10.0)
    assert first.replicas == 3 and "held 0 of 60 s" in first.reason
    early = decide(quiet, 3, 3, BOUNDS, 10.0 + DOWN_DELAY_S - 1, first.down_since)
    assert early.replicas == 3
    late = decide(quiet, 3, 3, BOUNDS, 10.0 + DOWN_DELAY_S, first.down_since)
    assert late.replicas == 2 and late.reason.startswith("g: 2 would: TTFT 75 ms")


def test_the_down_delay_is_the_fleets_own() -> None:
    quiet = [_tokens(ttft_s=0.050, tpot_s=0.010)]
    first = decide(quiet, 3, 3, BOUNDS, now=0.0, down_delay_s=5.0)
    assert "held 0 of 5 s" in first.reason
    assert decide(quiet, 3, 3, BOUNDS, 5.0, first.down_since, down_delay_s=5.0).replicas == 2


def test_a_generative_model_without_objectives_follows_its_requests_in_flight() -> None:
    # Its TTFT far above anything: with no objective declared it is a figure, not a goal.
    plain = _tokens(ttft_s=9.0, tpot_s=1.0, ttft_objective_s=0.0, tpot_objective_s=0.0)
    d = decide([plain], 1, 1, BOUNDS, now=0.0)
    assert d.replicas == 2 and d.reason == "in flight 6 / 4 each"  # ceil(6 / 4)
    assert d.figures["g.ttft_ms"] == 9000 and d.figures["g.ttft_objective_ms"] == 0


def _engine_load(rate: float, replicas: int) -> ModelLoad:
    """What a fleet of engines would report: each replica's decode step takes 4 ms plus 1 ms a
    request per second it carries, its TTFT 10 steps (the prompt's prefill among decodes)."""
    step = 0.004 + 0.001 * rate / replicas
    return _tokens(ttft_s=10 * step, tpot_s=step)


def _run_engines(rate: float, replicas: int, steps: int) -> list[int]:
    counts, down_since, missed = [], None, None
    for step in range(steps):
        load = _engine_load(rate, replicas)
        d = decide([load], replicas, replicas, BOUNDS, 5.0 * step, down_since, missed=missed)
        replicas, down_since, missed = d.replicas, d.down_since, d.missed
        counts.append(replicas)
    return counts


def test_a_steady_token_load_settles_without_flapping() -> None:
    # 60 requests/s: on 2 replicas a step takes 34 ms (TTFT 340 ms > 250), on 3 24 ms (TTFT
    # 240 ms < 250, TPOT 24 ms < 40): 3 are the fewest that hold both.
    fewest = next(n for n in range(1, 9) if _holds_tokens(_engine_load(60.0, n)))
    assert fewest == 3
    from_below = _run_engines(60.0, 1, 100)
    assert from_below[-1] == fewest and from_below == sorted(from_below)
    # From above the estimate (time per step in proportion to the load) is pessimistic for a
    # step with a fixed part: it may stop one above, never below, and never goes up again.
    from_above = _run_engines(60.0, 8, 100)
    assert from_above[-1] in (fewest, fewest + 1)
    assert from_above == sorted(from_above, reverse=True)


def _holds_tokens(load: ModelLoad) -> bool:
    return (
        load.ttft_s < UP_AT * load.ttft_objective_s
        and load.tpot_s < TPOT_UP_AT * load.tpot_objective_s
    )


def test_a_size_that_missed_its_goals_is_not_gone_back_to_at_the_same_rate() -> None:
    # 3 replicas missed TPOT at 20 requests/s; at 4 the estimate says 3 would hold (wrongly,
    # near an engine's knee): the measurement wins while the rate stays near 20.
    missed = decide([_tokens(ttft_s=0.050, tpot_s=0.045)], 3, 3, BOUNDS, now=0.0)
    assert missed.replicas == 4 and missed.missed == (3, 20.0)
    quiet = [_tokens(ttft_s=0.050, tpot_s=0.020)]  # 3 would be at 27 ms by the estimate
    kept = decide(quiet, 4, 4, BOUNDS, now=1e6, down_since=0.0, missed=missed.missed)
    assert kept.replicas == 4 and kept.down_since is None
    assert kept.reason.endswith("not 3: 3 missed at 20 requests/s, now 20")
    # The rate fell by more than a tenth: the size that missed may come back.
    lower = [dataclasses.replace(quiet[0], rate=20.0 * MISSED_RATE_SHARE - 1)]
    assert decide(lower, 4, 4, BOUNDS, 1e6, down_since=0.0, missed=missed.missed).replicas == 3
