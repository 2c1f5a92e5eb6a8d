"""The SLO tuner's candidate points and how it prunes them, from given service times."""

from __future__ import annotations

from dlscale.optimize.slo import _candidates, _with_delay, batch_sizes, instance_counts
from dlscale.optimize.variants import DeviceCaps

CPU4 = DeviceCaps("cpu", 4)


def test_grids() -> None:
    assert batch_sizes(64) == [1, 2, 4, 8, 16, 32, 64]
    assert batch_sizes(48) == [1, 2, 4, 8, 16, 32, 48]
    assert instance_counts(CPU4) == [1, 2, 4]
    assert instance_counts(DeviceCaps("cuda:0", 8)) == [1, 2, 3]


def test_infeasible_points_and_bracketed_batches_are_not_run() -> None:
    # ms per batch: throughput saturates past batch 8; batch 32 alone breaks a 10 ms bound.
    service = {1: {1: 1.0, 2: 1.2, 4: 1.6, 8: 2.4, 16: 4.6, 32: 9.0}}
    outcomes = _candidates(service, 0.010, CPU4)
    by_batch = {o.point.max_batch_size: o for o in outcomes}
    assert by_batch[32].status == "infeasible"
    assert "exceeds the 10 ms bound" in by_batch[32].reason
    kept = sorted(o.point.max_batch_size for o in outcomes if o.status == "candidate")
    # 16 is the largest feasible batch; 8 is the knee (its ceiling is >= 90% of the best).
    assert kept == [8, 16]
    assert all("bracketed" in by_batch[b].reason for b in (1, 2, 4))
    assert outcomes[0].status == "candidate"
    assert by_batch[16].point.threads == 4


def test_delay_is_only_what_the_bound_leaves() -> None:
    outcome = _candidates({2: {8: 2.0}}, 0.010, CPU4)[0]
    delayed = _with_delay(outcome, 0.010)
    assert delayed is not None and delayed.point.max_queue_delay_us == 2000
    tight = _candidates({2: {8: 4.99}}, 0.010, CPU4)[0]
    assert _with_delay(tight, 0.010) is not None
    assert _with_delay(_candidates({1: {8: 5.0}}, 0.010, CPU4)[0], 0.010) is None
