"""Autoscaling on the objective: the replicas a fleet wants, from each model's measured figures.

A pure function of figures and a clock (no Ray here: scale/autoscale.py feeds it from the
replicas' reports and keeps its state in Ray's policy state). Each model declares its
objectives in `[qos]`: `latency_objective_us` (the p99 of its time in the server), and for a
generative model `ttft_objective_us` and `tpot_objective_us` (the p99 of its time to first token
and per output token). Over the last interval the fleet's mean queue wait and mean TTFT are held
under UP_AT of their objectives, the mean TPOT under TPOT_UP_AT of its own, and each replica's
busy share (its rate over its capacity) at most MAX_BUSY: when one is crossed, replicas are
added, as many as the demand needs (the arrival rate at MAX_BUSY of a replica's capacity, and
the backlog drained within the objective, or the time a new replica takes to serve if
longer; at most twice as many), or where the demand is carried and the queue holds what the
wait says, as many as the estimate says bring all back; none more while replicas asked for
start, nor until their figures cover a whole look-back; after the fleet wanted fewer for the
down delay without a break it goes straight to the fewest the same estimate says hold all,
never back to a size measured missing a goal at about the same rate. Models without any
objective keep the in-flight rule: a replica per `target_in_flight` requests held. The fleet
follows the model that wants the most.
docs/scale.md, "Autoscaling on the objective".
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial

from dlscale.scale.starts import LOOK_BACK_S, NONE_SEEN, REPLICA_START_S, Starts

#: Replicas are added when a model's mean queue wait reaches this share of its objective (the
#: rest of the objective is its compute and the tail above the mean), or its mean TTFT this share
#: of its TTFT objective (TTFT is where queueing shows: its tail is a queue's).
UP_AT = 0.5
#: ... or its mean TPOT this share of its TPOT objective: a request's TPOT is already a mean over
#: its tokens, and every sequence of a decode batch waits the same steps, so TPOT spreads little
#: between requests and its p99 sits near its mean.
TPOT_UP_AT = 0.8
#: A replica goes only if the others would then compute at most this share of the time: past
#: it the estimate below says little, and a burst finds no room.
MAX_BUSY = 0.8
#: The most seconds the fleet must want fewer replicas, without a break, before they go (all at
#: once, to the fewest the estimate says hold every goal): scale/starts.py sets the hold from
#: the time a replica takes to return, measured.
DOWN_DELAY_S = 30.0
#: A fleet size seen missing its goals is not gone back to until the demand falls below this
#: share of the demand it missed at: an estimate can be wrong (an engine's TPOT grows faster
#: than its load near its knee), a measurement is not, and a rate a hair lower is noise.
MISSED_RATE_SHARE = 0.9
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
    #: Generative models: the p99 time to first token and per output token to hold, seconds;
    #: 0: none declared.
    ttft_objective_s: float = 0.0
    tpot_objective_s: float = 0.0
    #: Their mean time to first token and per output token over the interval, seconds (0: none
    #: measured).
    ttft_s: float = 0.0
    tpot_s: float = 0.0
    #: Requests/s one replica answers with every instance on its best batch size (0: unknown,
    #: as for an engine, whose batches the batcher does not time).
    capacity: float = 0.0
    #: How fast the requests held grew over the interval, requests/s (all replicas; < 0: the
    #: queue shrank).
    growth: float = 0.0

    @property
    def arrival(self) -> float:
        """Requests arriving per second: those answered and those the queue kept."""
        return max(0.0, self.rate + self.growth)

    @property
    def held_now(self) -> float:
        """Requests held at the interval's end: the mean held over it plus its growth over half
        of it. The mean lags a queue that moves: falling 14/s, it held 35 more than the queue
        at the end, and that backlog asked for a replica (BENCHMARKS.md, run 8 of the burst)."""
        return max(0.0, self.in_flight + self.growth * LOOK_BACK_S / 2)

    @property
    def has_objective(self) -> bool:
        """Whether the model declares any objective (else the in-flight rule sizes it)."""
        return max(self.objective_s, self.ttft_objective_s, self.tpot_objective_s) > 0


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
    #: The last fleet size whose measured figures missed a goal, and the demand it missed at
    #: (requests/s arriving and the backlog's drain, of the models with an objective,
    #: `demand`): the state to keep.
    missed: tuple[int, float] | None = None
    #: The last time replicas asked for were seen starting (None: none for LOOK_BACK_S): the
    #: state to keep. Until the figures cover a whole look-back without one, they are partly
    #: those of the fleet before it, and the fleet goes no higher on them.
    joined: float | None = None
    #: When the scale-up under way was asked for and how long the latest took: the state to
    #: keep (the hold down follows it).
    starts: Starts = NONE_SEEN


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


def predicted_per_sequence(measured: float, current: int, replicas: int) -> float:
    """A generative model's TTFT or TPOT with `replicas` sharing what `current` carry now: the
    load each carries, and the time of an engine step with it, scale by current over replicas.
    Going down it overstates a step with a fixed part, and understates one near the engine's
    knee, where each sequence also lives longer and more are in flight: `decide` then does not
    go back to a size measured missing its goals."""
    return measured * current / replicas


@dataclass(frozen=True)
class Goal:
    """One figure a model holds under a bound, as measured and as estimated with n replicas."""

    name: str
    measured: float
    bound: float
    estimate: Callable[[int], float]
    #: The busy share may reach its bound; the times must stay under theirs.
    inclusive: bool = False

    def met(self, value: float) -> bool:
        """Whether `value` of this figure holds the bound."""
        return value <= self.bound if self.inclusive else value < self.bound

    def says(self, value: float) -> str:
        """The figure at `value` against its bound, for the log."""
        if self.inclusive:
            return f"{self.name} {value:.2f} (goal <= {self.bound:g})"
        return f"{self.name} {_ms(value)} (goal < {_ms(self.bound)})"


def goals(load: ModelLoad, current: int) -> list[Goal]:
    """The figures a model with an objective holds: its mean wait, TTFT and TPOT against their
    declared objectives, and always each replica's busy share."""
    found = []
    if load.objective_s > 0:
        waits = partial(predicted_wait, load, current)
        found.append(Goal("wait", load.wait_s, UP_AT * load.objective_s, waits))
    for name, measured, objective, share in (
        ("TTFT", load.ttft_s, load.ttft_objective_s, UP_AT),
        ("TPOT", load.tpot_s, load.tpot_objective_s, TPOT_UP_AT),
    ):
        if objective > 0:
            per_sequence = partial(predicted_per_sequence, measured, current)
            found.append(Goal(name, measured, share * objective, per_sequence))

    def busy(n: int) -> float:
        return load.busy * current / n

    return [*found, Goal("busy", load.busy, MAX_BUSY, busy, inclusive=True)]


def objective_wants(load: ModelLoad, current: int, bounds: Bounds) -> tuple[int, str]:
    """Replicas one model with an objective wants, and why: the fewest the estimate says hold
    each of its goals (mean wait, TTFT, TPOT, busy share)."""
    held = goals(load, current)
    every = "both" if len(held) == 2 else "all"

    def holds(n: int) -> bool:
        return all(g.met(g.estimate(n)) for g in held)

    if not all(g.met(g.measured) for g in held):
        now = f"{load.model}: " + ", ".join(g.says(g.measured) for g in held)
        return _up(load, current, bounds, holds, now, every)
    under = ", ".join(f"{g.name} {_short(g, g.measured)} < {_short(g, g.bound)}" for g in held[:-1])
    under = under or f"busy {load.busy:.2f} <= {MAX_BUSY:g}"
    least = max(1, bounds.low)
    if current - 1 < least:
        return current, f"{load.model}: {under} at MIN"
    # The estimates grow as replicas go: the fewest that hold is the first from MIN that does.
    fewest = next(n for n in range(least, current + 1) if n == current or holds(n))
    shown = fewest if fewest < current else current - 1
    figures = f"{shown} would: " + ", ".join(g.says(g.estimate(shown)) for g in held)
    if fewest < current:
        return fewest, f"{load.model}: {figures}"
    return current, f"{load.model}: {under}; not fewer: {figures}"


def _up(
    load: ModelLoad,
    current: int,
    bounds: Bounds,
    holds: Callable[[int], bool],
    now: str,
    every: str,
) -> tuple[int, str]:
    """Replicas a model that misses a goal wants: as many as its demand needs where the fleet
    is short of it; none more where it carries the demand and its queue drains; else the
    fewest the estimate says hold every goal. At most twice as many at once."""
    top = min(bounds.high, 2 * current)
    demand = demanded(load, current)
    if demand is not None:
        n, sized = demand
        if n > current:
            bounded = f" (bounded at {top})" if n > top else ""
            return max(current + 1, min(n, top)), f"{now}; {sized}{bounded}"
        # These replicas carry the demand and drain the backlog within the objective. A busy
        # share above MAX_BUSY is then fewer replicas' (the figures are means over seconds
        # that predate the last ones); a queue that shrinks, or holds less than half what its
        # wait says (Little's law: a mean wait W at an arrival rate a means a x W queued; half:
        # room for the noise of a mean), had a wait that is a backlog's being drained. Only a
        # steady queue's wait is left to the estimate.
        stale = load.busy > MAX_BUSY or load.growth < 0
        if stale or load.in_flight < 0.5 * load.arrival * load.wait_s:
            return current, f"{now}; {sized}: the backlog drains"
    for n in range(current + 1, top + 1):
        if holds(n):
            return n, f"{now}; {n} would hold {every}"
    return max(top, current + 1), f"{now}; doubled"


def replica_capacity(load: ModelLoad, current: int) -> float:
    """Requests/s one replica answers at most: as reported, else its answered rate over its
    busy share (0: unknown)."""
    if load.capacity > 0:
        return load.capacity
    if load.busy > 0 and load.rate > 0:
        return load.rate / (load.busy * current)
    return 0.0


def demanded(load: ModelLoad, current: int) -> tuple[int, str] | None:
    """The replicas a model's demand needs, and the figures: its arrival rate at MAX_BUSY of a
    replica's capacity, and at full capacity that rate plus the backlog (the requests held now
    beyond what a wait at the goal holds) drained within `drain_within`; None without a
    capacity or a latency objective (an engine's TTFT and TPOT goals follow the estimate).

    Not the backlog's wait: a saturated fleet's wait says how far behind it is, and an
    estimate scaled from it asked for replicas the arrival rate did not need (docs/scale.md)."""
    capacity = replica_capacity(load, current)
    if capacity <= 0 or load.objective_s <= 0:
        return None
    arrival = load.arrival
    carry = arrival / (capacity * MAX_BUSY)
    backlog = backlog_of(load)
    drain = demand(load) / capacity
    # A hair over a whole count is the float's, not the load's.
    n = max(1, math.ceil(max(carry, drain) - 1e-9))
    said = (
        f"arrival {arrival:.3g}/s (answered {load.rate:.3g} {load.growth:+.3g} queued), "
        f"backlog {backlog:.3g} to drain in {_ms(drain_within(load))}: {n} at "
        f"{capacity:.3g}/s each"
    )
    return n, said


def backlog_of(load: ModelLoad) -> float:
    """Requests held now beyond what a wait at the goal holds at the arrival rate (Little's
    law), so that a steady queue within the goal counts for nothing; 0 without a latency
    objective (an engine's sequences in flight are its batch, not a queue)."""
    if load.objective_s <= 0:
        return 0.0
    return max(0.0, load.held_now - load.arrival * UP_AT * load.objective_s)


def demand(load: ModelLoad) -> float:
    """Requests/s the fleet must answer: those arriving, and the backlog drained within
    `drain_within`."""
    return load.arrival + backlog_of(load) / drain_within(load)


def drain_within(load: ModelLoad) -> float:
    """Seconds a backlog is drained within: the objective, but no sooner than a new replica
    could answer (REPLICA_START_S): within the objective alone, a backlog of 38 on the burst
    bench asked for 4 replicas where 2 carried the arrival rate and, at their capacity, drain
    it in 2 s."""
    return max(load.objective_s, REPLICA_START_S)


def _short(goal: Goal, value: float) -> str:
    return f"{value:.2f}" if goal.inclusive else _ms(value)


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
    down_delay_s: float = DOWN_DELAY_S,
    missed: tuple[int, float] | None = None,
    joined: float | None = None,
    starts: Starts = NONE_SEEN,
    reported: int | None = None,
) -> Decision:
    """Replicas wanted now: the most any model wants (estimated from the `running` replicas'
    figures), within MIN and MAX; no more than `target` while replicas start or until their
    figures cover LOOK_BACK_S (`joined`, from the previous decision); fewer only after
    a hold of wanting fewer (`down_since`; `starts` sets it, at most `down_delay_s`), never while
    replicas start, and never back to a size that `missed` its goals unless the rate fell well
    below the one it missed at, nor on figures from fewer than the `running` replicas
    (`reported`; None: every one reported)."""
    starts = starts.seen(running, target, now)
    running = max(1, running)
    joined = _joined(running, target, now, joined)
    aimed = [x for x in loads if x.has_objective]
    wants = [
        _paced(objective_wants(x, running, bounds), running, target, now, joined) for x in aimed
    ]
    plain = [x for x in loads if not x.has_objective]
    if plain or not wants:  # a count of requests held: the same however many replicas start
        wants.append(in_flight_wants(plain, bounds))
    wanted, why = max(wants, key=lambda w: w[0])
    wanted = min(max(wanted, bounds.low), bounds.high)
    figures = _figures(loads, running, target)
    # The demand, not the rate answered: Ray's means cover LOOK_BACK_S, and a size that misses
    # in a burst's first seconds answered a rate of the seconds before it. Marked at 3.8/s (4
    # clients, 20/s once the means covered them), 1 replica was never gone back to under one
    # client's 3.5/s (the scale test on a loaded machine).
    rate = sum(demand(x) for x in aimed)
    # Figures partly from before the last replicas ran say a size missed that did not.
    if joined is None and any(not all(g.met(g.measured) for g in goals(x, running)) for x in aimed):
        missed = (running, rate)
    if wanted >= target or target > bounds.high:
        starts = starts.asking(now) if wanted > target else starts
        return Decision(wanted, target, why, figures, None, missed, joined, starts)
    if running < target:  # the figures predate the replicas still starting
        starting = f"{why}; {target - running} replica(s) starting"
        return Decision(target, target, starting, figures, None, missed, joined, starts)
    if reported is not None and reported < running:
        # A replica whose figures are missing (its server too slow to read on a loaded host:
        # a CI run beside two burners) reads as one with no load: fewer, never, on that.
        partial = f"{why}; not fewer: figures from {reported} of {running} replicas"
        return Decision(target, target, partial, figures, None, missed, joined, starts)
    if missed is not None and wanted <= missed[0] and rate > MISSED_RATE_SHARE * missed[1]:
        seen = f"{missed[0]} missed at {missed[1]:.3g} requests/s, now {rate:.3g}"
        why, wanted = f"{why}; not {wanted}: {seen}", missed[0] + 1
        if wanted >= target:
            return Decision(target, target, why, figures, None, missed, joined, starts)
    since = now if down_since is None else down_since
    hold = starts.hold_s(down_delay_s)
    if now - since < hold:
        held = f"{why}; held {now - since:.0f} of {hold:.3g} s ({starts.says()})"
        return Decision(target, target, held, figures, since, missed, joined, starts)
    return Decision(wanted, target, why, figures, None, missed, joined, starts)


def _joined(running: int, target: int, now: float, joined: float | None) -> float | None:
    """When replicas were last seen starting: now while some do, kept for LOOK_BACK_S after
    the last ran, None after (the figures are then all the running replicas' own)."""
    if running < target:
        return now
    return joined if joined is not None and now - joined < LOOK_BACK_S else None


def _paced(
    want: tuple[int, str], running: int, target: int, now: float, joined: float | None
) -> tuple[int, str]:
    """A model's want, no higher than `target` while replicas asked for start or their figures
    are not yet their own: those replicas are capacity on the way."""
    wanted, why = want
    if wanted <= target or joined is None:
        return want
    if running < target:
        return target, f"{why}; not more: {target - running} replica(s) starting"
    covered = f"{now - joined:.0f} of {LOOK_BACK_S:g} s"
    return target, f"{why}; not more: the figures cover {covered} since the last replica ran"


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
        if x.capacity > 0 or x.growth != 0:  # what sizes the fleet up from the demand
            figures |= {f"{x.model}.capacity": x.capacity, f"{x.model}.growth": x.growth}
        for name, measured, objective in (
            ("ttft", x.ttft_s, x.ttft_objective_s),
            ("tpot", x.tpot_s, x.tpot_objective_s),
        ):
            if measured > 0 or objective > 0:  # a generative model's: classic lines stay short
                figures[f"{x.model}.{name}_ms"] = measured * 1e3
                figures[f"{x.model}.{name}_objective_ms"] = objective * 1e3
    return figures


def _ms(seconds: float) -> str:
    return "inf" if math.isinf(seconds) else f"{seconds * 1e3:.3g} ms"
