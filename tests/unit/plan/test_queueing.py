"""The batching-server simulation: sane against queueing theory, infinite past saturation."""

from __future__ import annotations

import math

import pytest

from dlscale.errors import PlanError
from dlscale.plan.queueing import (
    BatchingServer,
    ServiceTime,
    batching_policy,
    peak_rate,
    simulate,
)


def linear(fixed: float, per_item: float) -> ServiceTime:
    """A batch costs a fixed launch time plus a time per item."""
    return lambda b: fixed + per_item * b


def test_matches_md1_mean_latency() -> None:
    # Batch 1, no delay, constant service s: an M/D/1 queue. Pollaczek-Khinchine gives the
    # mean wait rho s / (2 (1 - rho)), so the mean latency at rho = 0.5 is 1.5 s.
    s = 0.002
    server = BatchingServer(lambda b: s, batching_policy(1, 0.0))
    for rho in (0.3, 0.5, 0.7):
        want = s + rho * s / (2 * (1 - rho))
        assert simulate(server, rho / s).mean == pytest.approx(want, rel=0.08)


def test_p99_grows_with_load() -> None:
    server = BatchingServer(linear(1e-3, 2e-4), batching_policy(16, 0.0), devices=2)
    p99s = [simulate(server, u * server.capacity).p99 for u in (0.3, 0.5, 0.7, 0.85, 0.95)]
    assert p99s == sorted(p99s)
    assert p99s[-1] > 2 * p99s[0]


def test_infinite_at_and_past_saturation() -> None:
    server = BatchingServer(linear(1e-3, 2e-4), batching_policy(8, 1e-3))
    assert server.capacity == pytest.approx(8 / 2.6e-3)
    for factor in (1.0, 1.5):
        assert math.isinf(simulate(server, factor * server.capacity).p99)
    assert not math.isinf(simulate(server, 0.9 * server.capacity).p99)


def test_idle_request_waits_the_delay_then_runs_alone() -> None:
    # Triton's rule: every batch waits out the delay, even with nobody to batch with.
    server = BatchingServer(linear(1e-3, 2e-4), batching_policy(8, 4e-3, adaptive_delay=False))
    result = simulate(server, 1.0)  # one request a second
    assert result.p50 == pytest.approx(4e-3 + 1.2e-3)
    assert result.mean_batch == pytest.approx(1.0, abs=0.01)


def test_adaptive_batcher_skips_the_delay_when_arrivals_are_sparse() -> None:
    server = BatchingServer(linear(1e-3, 2e-4), batching_policy(8, 4e-3))
    idle = simulate(server, 1.0)  # gaps of ~1 s, far longer than the 4 ms delay
    assert idle.p50 == pytest.approx(1.2e-3)
    assert idle.mean_batch == pytest.approx(1.0, abs=0.01)
    # Arrivals 1 ms apart: company comes within the delay, so batches wait and grow.
    busy = simulate(server, 1000.0)
    fixed = BatchingServer(linear(1e-3, 2e-4), batching_policy(8, 4e-3, adaptive_delay=False))
    assert busy.mean_batch > 2
    assert busy.mean_batch == pytest.approx(simulate(fixed, 1000.0).mean_batch, rel=0.05)


def test_capacity_counts_the_most_efficient_batch() -> None:
    # A CPU with no batching gain: a batch of b costs more than b batches of 1.
    server = BatchingServer(lambda b: 0.1 * b**1.2, batching_policy(16, 0.0))
    assert server.capacity == pytest.approx(10.0)
    assert simulate(server, 9.9 * 0.5).p99 < simulate(server, 9.9 * 0.8).p99 < math.inf


def test_batches_fill_under_load() -> None:
    server = BatchingServer(linear(1e-3, 1e-4), batching_policy(32, 2e-3))
    light, heavy = (simulate(server, u * server.capacity) for u in (0.1, 0.9))
    assert light.mean_batch < heavy.mean_batch <= 32


def test_instances_share_their_device() -> None:
    one = BatchingServer(linear(1e-3, 1e-4), batching_policy(8, 0.0))
    two = BatchingServer(linear(1e-3, 1e-4), batching_policy(8, 0.0), instances_per_device=2)
    assert two.capacity == pytest.approx(one.capacity)
    pooled = BatchingServer(linear(1e-3, 1e-4), batching_policy(8, 0.0), devices=4)
    assert pooled.capacity == pytest.approx(4 * one.capacity)


def test_service_spread_lengthens_the_tail_not_the_mean_service() -> None:
    constant = BatchingServer(lambda b: 0.1 * b, batching_policy(1, 0.0))
    # Half the batches take 0.5x their mean, half 1.5x: the same mean, more variance.
    varied = BatchingServer(lambda b: 0.1 * b, batching_policy(1, 0.0), service_spread=(1, 3))
    assert varied.capacity == constant.capacity
    light = simulate(varied, 0.01)  # no queueing: latency is the service time itself
    assert light.mean == pytest.approx(0.1, rel=0.03)
    assert light.p99 == pytest.approx(0.15)
    # M/G/1 (Pollaczek-Khinchine): mean wait = rho s (1 + cv^2) / (2 (1 - rho)); cv = 0.5 here.
    rho = 0.6
    want = 0.1 + rho * 0.1 * 1.25 / (2 * (1 - rho))
    assert simulate(varied, rho / 0.1).mean == pytest.approx(want, rel=0.08)
    assert peak_rate(varied, 0.5) < peak_rate(constant, 0.5)
    with pytest.raises(PlanError):
        BatchingServer(lambda b: 0.1, batching_policy(1, 0.0), service_spread=(0.0, 1.0))


def test_same_seed_same_answer() -> None:
    server = BatchingServer(linear(1e-3, 1e-4), batching_policy(8, 1e-3))
    assert simulate(server, 3000.0) == simulate(server, 3000.0)


def test_peak_rate_holds_the_bound_and_grows_with_it() -> None:
    server = BatchingServer(linear(1e-3, 1e-4), batching_policy(16, 5e-4, adaptive_delay=False))
    peaks = [peak_rate(server, bound) for bound in (4e-3, 8e-3, 16e-3, 32e-3)]
    assert peaks == sorted(peaks)
    assert 0 < peaks[0] < peaks[-1] < server.capacity
    assert simulate(server, peaks[1]).p99 <= 8e-3
    # An idle request already misses a bound below delay + s(1) = 1.6 ms: no rate holds it.
    assert peak_rate(server, 1.5e-3) == 0.0


def test_bad_settings() -> None:
    with pytest.raises(PlanError):
        BatchingServer(linear(1e-3, 1e-4), batching_policy(0, 0.0))
    with pytest.raises(PlanError):
        BatchingServer(linear(1e-3, 1e-4), batching_policy(4, -1.0))
    server = BatchingServer(linear(1e-3, 1e-4), batching_policy(4, 0.0))
    with pytest.raises(PlanError):
        simulate(server, 0.0)
    with pytest.raises(PlanError):
        peak_rate(server, 0.0)


def test_servers_that_batch_and_serve_alike_share_one_peak() -> None:
    # A plan asks again for tenants of one model and p99, each with a curve of its own: equal
    # times and settings make equal servers, answered once.
    def server(fixed: float, spread: tuple[float, ...] = ()) -> BatchingServer:
        return BatchingServer(linear(fixed, 1e-4), batching_policy(8, 1e-3), service_spread=spread)

    assert server(1e-3) == server(1e-3) and hash(server(1e-3)) == hash(server(1e-3))
    assert server(1e-3) != server(2e-3) and server(1e-3) != server(1e-3, (0.5, 1.5))
    assert server(1e-3) != BatchingServer(linear(1e-3, 1e-4), batching_policy(8, 2e-3))
    assert server(1e-3) != BatchingServer(linear(1e-3, 1e-4), batching_policy(8, 1e-3), 2)
    first = peak_rate(server(1.5e-3), 6e-3)
    hits = peak_rate.cache_info().hits
    assert peak_rate(server(1.5e-3), 6e-3) == first
    assert peak_rate.cache_info().hits == hits + 1
