"""The batching policy's rules: when a batch goes, the adaptive delay, company, priority levels."""

from __future__ import annotations

import pytest

from dlscale.errors import InvalidInput
from dlscale.models.config import ModelConfig
from dlscale.models.config_sections import BatchingConfig
from dlscale.serving.policy import GAP_WEIGHT, PROBE_FIRST, ArrivalGaps, BatchPolicy, Company


def test_waiting_for_company_follows_the_gap_between_arrivals() -> None:
    policy = BatchPolicy(8, BatchingConfig(max_queue_delay_us=500))
    gaps = ArrivalGaps()
    assert not policy.worth_waiting(gaps.smoothed)  # nothing seen yet
    gaps.note(0.001)
    gaps.note(0.004)  # a lone client: 3 ms apart, delay 0.5 ms
    assert not policy.worth_waiting(gaps.smoothed)
    for t in range(5_000, 5_020):  # a burst: 1 us apart
        gaps.note(t * 1e-6)
    assert policy.worth_waiting(gaps.smoothed)
    strict = BatchPolicy(8, BatchingConfig(adaptive_queue_delay=False))
    assert strict.worth_waiting(ArrivalGaps().smoothed)  # nothing seen, yet it waits: asked for


def test_the_gap_is_smoothed_from_the_first_pair_on() -> None:
    gaps = ArrivalGaps()
    gaps.note(0.0)  # an arrival at the clock's zero counts like any other
    gaps.note(0.003)
    assert gaps.smoothed == pytest.approx(0.003)
    gaps.note(0.004)
    assert gaps.smoothed == pytest.approx((1 - GAP_WEIGHT) * 0.003 + GAP_WEIGHT * 0.001)


def test_a_batch_goes_full_at_a_preferred_size_or_after_the_delay() -> None:
    policy = BatchPolicy(8, BatchingConfig(max_queue_delay_us=1000, preferred_batch_sizes=[4]))
    assert policy.closing_prefix([1, 2]) == 0
    assert policy.closing_prefix([1, 2, 1, 3]) == 3  # 4 rows: the longest prefix that closes
    assert policy.closing_prefix([3, 3, 2]) == 3  # 8 rows: full
    busy = 1e-6  # arrivals far closer than the delay: company is expected
    assert policy.to_send([1, 2], oldest=0.0, now=0.0009, gap=busy) == 0
    assert policy.to_send([1, 2], oldest=0.0, now=0.001, gap=busy) == 2  # waited the delay
    assert policy.to_send([1, 2, 1, 3], oldest=0.0, now=0.0, gap=busy) == 3
    assert policy.to_send([1, 2], oldest=0.0, now=0.0, gap=0.01) == 2  # no company expected
    assert policy.close_by(0.5) == pytest.approx(0.501)


def test_an_unbatched_model_sends_each_request_alone() -> None:
    policy = BatchPolicy.of(ModelConfig(name="m", max_batch_size=0))
    assert not policy.batched
    assert policy.to_send([1], oldest=0.0, now=0.0, gap=1e-9) == 1


def test_priority_levels_map_to_queues() -> None:
    policy = BatchPolicy(4, BatchingConfig(priority_levels=3, default_priority_level=2))
    assert [policy.level_of(p) for p in (1, 2, 3, 0)] == [0, 1, 2, 1]
    assert BatchPolicy(4, BatchingConfig(priority_levels=3)).level_of(0) == 2  # the lowest
    with pytest.raises(InvalidInput, match="priority 4 is out of range"):
        policy.level_of(4)


def test_a_request_alone_in_flight_goes_at_once_after_a_lone_batch() -> None:
    policy = BatchPolicy(8, BatchingConfig(max_queue_delay_us=500))
    busy = 1e-6  # by the gap between arrivals, company is expected
    company = Company()
    assert company.arrives_alone(0) and not company.arrives_alone(1)  # a fresh model
    alone = company.arrives_alone(0)
    assert policy.to_send([1], oldest=0.0, now=0.0, gap=busy, alone=alone) == 1
    company.sent(3, others=0)  # a batch that had company
    assert not company.arrives_alone(0)
    alone = company.arrives_alone(0)
    assert policy.to_send([1], oldest=0.0, now=0.0, gap=busy, alone=alone) == 0
    company.sent(1, others=2)  # alone in its batch, but others were in flight
    assert not company.arrives_alone(0)
    company.sent(1, others=0)
    assert company.arrives_alone(0)
    strict = BatchPolicy(8, BatchingConfig(max_queue_delay_us=500, adaptive_queue_delay=False))
    assert strict.to_send([1], oldest=0.0, now=0.0, gap=busy, alone=True) == 0  # as asked


def test_a_wait_that_found_company_expects_it_again_whatever_the_gap() -> None:
    policy = BatchPolicy(8, BatchingConfig(max_queue_delay_us=500))
    far = 1e-3  # arrivals twice the delay apart: by the gap, no company is expected
    company = Company()
    company.sent(1, others=1)  # a batch that did not wait its delay: says nothing of waits
    assert not company.expected
    assert policy.to_send([1], oldest=0.0, now=0.0, gap=far) == 1
    company.sent(3, others=0, waited_out=True)  # a wait that found company
    gap = 0.0 if company.expected else far  # as the Batcher and the planner ask
    assert company.expected and policy.to_send([1], oldest=0.0, now=0.0, gap=gap) == 0
    company.sent(2, others=0)  # sent before its delay: the evidence stands
    assert company.expected
    company.sent(1, others=0, waited_out=True)  # a whole delay and no one came
    assert not company.expected


def test_a_probe_waits_for_company_whatever_the_gap() -> None:
    company = Company()
    company.sent(1, others=0)  # a lone batch: the lone rule is on
    alone = [company.arrives_alone(0) for _ in range(PROBE_FIRST)]
    assert alone == [True] * (PROBE_FIRST - 1) + [False] and company.expected
    company.sent(1, others=0, waited_out=True)  # the probe found no one: twice as far next
    assert not company.expected and company.probe_after == 2 * PROBE_FIRST
    company.sent(2, others=0)  # company met: the lone rule is off, the interval back to 16
    assert not company.arrives_alone(0) and company.probe_after == PROBE_FIRST
