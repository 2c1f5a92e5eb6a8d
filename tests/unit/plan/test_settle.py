"""The plan and the autoscaler agree: on the planner's simulated steady load, the objective rule
(scale/objective.py) settles on the count `settled_replicas` predicts, from MIN and from MAX;
beside `plan serve`'s own count (the p99 within the objective) it is within one where the mean
wait and the tail scale alike, and fewer where the tail grows faster (docs/scale.md)."""

from __future__ import annotations

import math
from functools import cache

import pytest

from dlscale.plan.queueing import BatchingServer, batching_policy, peak_rate
from dlscale.plan.settle import settled_replicas, steady
from dlscale.scale.objective import DOWN_DELAY_S, MAX_BUSY, UP_AT, Bounds, ModelLoad, decide

HIGH = 16
#: A batching model (1 ms + 0.2 ms a row, batches up to 16) and one of batch 1 (2 ms).
BATCHING = BatchingServer(lambda b: 1e-3 + 2e-4 * b, batching_policy(16, 0.0))
SINGLE = BatchingServer(lambda b: 2e-3, batching_policy(1, 0.0))


def _policy_settles(server: BatchingServer, rate: float, objective_s: float, start: int) -> int:
    """Run the rule on the simulated figures of each fleet size until it stops moving."""

    @cache
    def load(n: int) -> ModelLoad:
        here = steady(server, rate / n)
        return ModelLoad("m", objective_s, rate, here.wait_s, here.busy, 0.0)

    replicas, down_since, bounds = start, None, Bounds(1, HIGH)
    for step in range(4 * HIGH):  # a step per delay: each may move one replica down
        d = decide([load(replicas)], replicas, replicas, bounds, step * DOWN_DELAY_S, down_since)
        replicas, down_since = d.replicas, d.down_since
    return replicas


@pytest.mark.parametrize("server", [BATCHING, SINGLE], ids=["batching", "batch-1"])
@pytest.mark.parametrize("load", [2.5, 5.3])
@pytest.mark.parametrize("objective_s", [0.010, 0.030])
def test_the_rule_settles_where_the_plan_says(
    server: BatchingServer, load: float, objective_s: float
) -> None:
    rate = load * server.capacity
    planned = settled_replicas(server, rate, UP_AT * objective_s, MAX_BUSY, (1, HIGH))
    assert planned is not None
    assert _policy_settles(server, rate, objective_s, start=1) == planned
    assert _policy_settles(server, rate, objective_s, start=HIGH) == planned


def _plan_serve(server: BatchingServer, rate: float, objective_s: float) -> int:
    """`plan serve`'s count for this batcher: devices at the peak rate whose p99 holds."""
    return math.ceil(rate / peak_rate(server, objective_s))


def test_with_batching_the_plan_is_within_one() -> None:
    rate = 2.5 * BATCHING.capacity
    settled = settled_replicas(BATCHING, rate, UP_AT * 0.010, MAX_BUSY, (1, HIGH))
    assert settled is not None
    assert abs(settled - _plan_serve(BATCHING, rate, 0.010)) <= 1


def test_where_the_tail_outgrows_the_mean_the_plan_wants_more() -> None:
    # Batch 1 near a tight objective: the p99 of an M/D/1 wait is several times its mean, so
    # holding the p99 within 10 ms takes more replicas than holding the mean under 5 ms.
    rate = 5.3 * SINGLE.capacity
    settled = settled_replicas(SINGLE, rate, UP_AT * 0.010, MAX_BUSY, (1, HIGH))
    assert settled is not None and _plan_serve(SINGLE, rate, 0.010) > settled + 1
