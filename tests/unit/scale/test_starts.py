"""The hold down follows how long a replica took to start (scale/starts.py), in virtual time:
measured from the decision that raised the target to the one that found every replica running,
kept in the policy's state, three returns (Ray's look-back and the start) at most the fleet's
`--scale-down-delay`."""

from __future__ import annotations

import pytest

from dlscale.scale.objective import DOWN_DELAY_S, Bounds, ModelLoad, decide
from dlscale.scale.starts import (
    HOLD_RETURNS,
    LOOK_BACK_S,
    NONE_SEEN,
    REPLICA_START_S,
    Starts,
)

BOUNDS = Bounds(1, 8, target_in_flight=4.0)
IDLE = [ModelLoad("m", 0.020, rate=100.0, wait_s=0.0, busy=0.05, in_flight=0.0)]


def test_a_start_is_timed_from_the_raised_target_to_every_replica_running() -> None:
    starts = NONE_SEEN.asking(10.0)
    assert starts == Starts(asked=10.0, took_s=None)
    assert NONE_SEEN.seen(running=1, target=2, now=10.0) == starts  # one Ray replaces
    assert starts.seen(running=1, target=3, now=11.0) == starts  # asked once, at the first
    done = starts.seen(running=3, target=3, now=12.5)
    assert done == Starts(asked=None, took_s=2.5)
    assert done.seen(running=3, target=3, now=60.0) == done  # kept until the next scale-up
    again = done.seen(running=3, target=4, now=61.0).seen(running=4, target=4, now=73.0)
    assert again.took_s == 12.0  # the latest start: the host's load now


def test_the_hold_is_three_returns_of_the_measured_start_at_most_the_delay() -> None:
    assert NONE_SEEN.hold_s(DOWN_DELAY_S) == DOWN_DELAY_S  # unmeasured: as before starts were
    assert HOLD_RETURNS * (LOOK_BACK_S + REPLICA_START_S) == DOWN_DELAY_S
    assert Starts(None, 2.0).hold_s(DOWN_DELAY_S) == pytest.approx(21.0)
    assert Starts(None, 15.0).hold_s(DOWN_DELAY_S) == DOWN_DELAY_S  # a loaded host: the most
    assert Starts(None, 2.0).hold_s(5.0) == 5.0  # --scale-down-delay 5


def test_the_kept_state_comes_back_and_a_foreign_one_is_none_seen() -> None:
    starts = Starts(3.0, 2.0)
    assert Starts.from_kept(starts.kept()) == starts
    assert Starts.from_kept([None, 2.0]) == Starts(None, 2.0)
    for foreign in (None, "x", [1.0], {"asked": 1.0}):
        assert Starts.from_kept(foreign) == NONE_SEEN


def test_a_fleet_whose_replica_started_in_two_seconds_lets_it_go_after_21_not_30() -> None:
    # A scale-up seen through the decisions: asked at 100 s, running at 102 s.
    busy = [ModelLoad("m", 0.020, rate=100.0, wait_s=0.015, busy=0.9, in_flight=4.0)]
    up = decide(busy, 1, 1, BOUNDS, now=100.0)
    assert up.replicas > 1 and up.starts == Starts(100.0, None)
    starting = decide(IDLE, 1, 2, BOUNDS, now=101.0, starts=up.starts)
    ran = decide(IDLE, 2, 2, BOUNDS, now=102.0, starts=starting.starts)
    assert ran.starts == Starts(None, 2.0)
    first = decide(IDLE, 2, 2, BOUNDS, now=200.0, starts=ran.starts)
    assert first.replicas == 2 and "held 0 of 21 s" in first.reason
    kept = first.down_since, first.starts
    early = decide(IDLE, 2, 2, BOUNDS, 220.0, kept[0], starts=kept[1])
    assert early.replicas == 2
    late = decide(IDLE, 2, 2, BOUNDS, 221.0, kept[0], starts=kept[1])
    assert late.replicas == 1
    # Unmeasured, the same fleet holds the whole delay.
    assert decide(IDLE, 2, 2, BOUNDS, 221.0, kept[0]).replicas == 2
