"""The replica count an objective autoscaler settles on for a steady rate, by the queueing model.

`dlscale serve --ray --autoscale` (scale/objective.py) adds replicas while a model's mean queue
wait is at or above a share of its objective or a replica is busier than a share of its
capacity, and removes one only while the others would hold both. On a steady load it therefore
stops at the fewest replicas that hold both: `settled_replicas` finds them with the planner's
own simulation of the batcher, each replica taking an equal share of a Poisson stream (as
`plan_device` does). `plan_device` sizes for the p99 of the whole time in the server instead,
so the two counts differ where the mean wait and the tail do not scale alike (docs/scale.md).

A generative model's rule holds its mean TTFT and TPOT under shares of their objectives: on a
steady load it stops at the fewest replicas whose steady operating point (plan/llm_capacity.py:
the fewest sequences in flight that carry each replica's share of the rate) holds both, which
is `plan serve`'s own count for bounds at those shares (`settled_generative`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from dlscale.errors import PlanError
from dlscale.plan.llm_capacity import (
    DEFAULT_MAX_BATCH,
    DecoderOnDevice,
    OperatingPoint,
    TokenLoad,
    operating_point,
    plan_device,
)
from dlscale.plan.queueing import DEFAULT_REQUESTS, DEFAULT_SEED, BatchingServer, replay

#: The share of the first requests left out of the figures: the queue starts empty.
_WARMUP_SHARE = 0.05


@dataclass(frozen=True)
class Steady:
    """One replica at a steady rate: its mean queue wait (s) and its busy share (the rate over
    its capacity, as the autoscaler reads it)."""

    rate: float
    wait_s: float
    busy: float


def steady(
    server: BatchingServer, rate: float, requests: int = DEFAULT_REQUESTS, seed: int = DEFAULT_SEED
) -> Steady:
    """What a replica measures at `rate` (Poisson arrivals, one row each): the figures the
    autoscaler reads from its counters. Past saturation the wait is infinite."""
    if rate <= 0:
        raise PlanError(f"arrival rate must be positive, got {rate}")
    if rate >= server.capacity:
        return Steady(rate, float("inf"), 1.0)
    gaps = np.random.default_rng(seed).exponential(1.0 / rate, requests)
    arrivals = np.cumsum(gaps)
    run = replay(server, arrivals.tolist(), seed)
    starts = np.repeat(np.asarray(run.closes), run.sizes)
    skip = int(requests * _WARMUP_SHARE)
    wait = float((starts - arrivals)[skip:].mean())
    return Steady(rate, wait, rate / server.capacity)


def settled_replicas(
    server: BatchingServer,
    rate: float,
    wait_bound_s: float,
    max_busy: float = 1.0,
    bounds: tuple[int, int] = (1, 64),
) -> int | None:
    """The fewest replicas in `bounds` (MIN, MAX), each a `server`, whose mean queue wait at an
    equal share of `rate` is under `wait_bound_s` with each at most `max_busy` of its capacity;
    None when even MAX do not."""
    low, high = bounds
    for n in range(max(1, low), high + 1):
        here = steady(server, rate / n)
        if here.wait_s < wait_bound_s and here.busy <= max_busy:
            return n
    return None


def steady_point(
    model: DecoderOnDevice, load: TokenLoad, rate: float, max_batch: int = DEFAULT_MAX_BATCH
) -> OperatingPoint | None:
    """What one replica of a generative model runs at `rate` requests/s (`load`'s ISL and OSL):
    the fewest sequences in flight that carry it (Little's law), with their TTFT and TPOT, the
    figures the autoscaler reads as means; None when no batch that fits carries it."""
    for batch in range(1, min(model.max_sequences(load.context), max_batch) + 1):
        point = operating_point(model, load, batch)
        if point.requests_per_s(load.osl) >= rate:
            return point
    return None


def settled_generative(
    model: DecoderOnDevice,
    load: TokenLoad,
    ttft_share: float,
    tpot_share: float,
    max_batch: int = DEFAULT_MAX_BATCH,
) -> int | None:
    """The replicas the objective rule settles on for a generative model at `load`'s rate, its
    bounds the objectives: `plan_device`'s count with the TTFT and TPOT bounds at the shares
    the rule holds their means under (None when no batch holds them)."""
    held = replace(load, ttft_s=ttft_share * load.ttft_s, tpot_s=tpot_share * load.tpot_s)
    return plan_device(model, held, max_batch).devices
