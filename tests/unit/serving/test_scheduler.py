"""The device scheduler's decisions, driven with a fake clock (times are plain numbers)."""

from __future__ import annotations

import pytest

from dlscale.serving.qos.scheduler import (
    STALE_AFTER,
    TAIL_AIM,
    TAIL_CEILING,
    TAIL_EVERY,
    TAIL_GAIN,
    Demand,
    DeviceScheduler,
    Grant,
    ServiceTimes,
    Tenant,
)


def _times(table: dict[int, float]) -> ServiceTimes:
    service = ServiceTimes()
    for rows, seconds in table.items():
        service.observe(rows, seconds)
    return service


def _tenant(name: str, per_row: float, max_rows: int = 32, **kw: object) -> Tenant:
    """A [qos] tenant whose batches take `per_row` seconds a row (learned at 1 and max rows)."""
    times = _times({1: per_row, max_rows: per_row * max_rows})
    return Tenant(name, max_rows=max_rows, qos=True, service=times, **kw)  # type: ignore[arg-type]


def _device(*tenants: Tenant) -> DeviceScheduler:
    device = DeviceScheduler()
    for t in tenants:
        device.join(t)
    return device


# -- service times ---------------------------------------------------------------------------------


def test_service_times_interpolate_between_sizes_and_scale_beyond() -> None:
    service = _times({2: 0.010, 8: 0.016})
    assert service.expected(1) == pytest.approx(0.010)  # below the smallest: its time
    assert service.expected(5) == pytest.approx(0.013)  # linear between 2 and 8
    assert service.expected(16) == pytest.approx(0.032)  # above: proportional to rows
    assert ServiceTimes().expected(4) == 0.0  # nothing known yet


def test_service_times_never_fall_with_more_rows() -> None:
    service = _times({1: 0.004, 4: 0.020, 8: 0.012})  # a noisy 8 measured faster than 4
    assert service.expected(8) == pytest.approx(0.020)
    assert service.largest_within(0.019, 8) == 3
    assert service.largest_within(0.020, 8) == 8


def test_service_bound_adds_deviations() -> None:
    service = ServiceTimes()
    for seconds in (0.010, 0.020) * 20:
        service.observe(4, seconds)
    assert service.bound(4) > service.expected(4) + 0.005


def test_sizes_not_seen_for_a_while_are_forgotten() -> None:
    service = _times({32: 1.0})  # a cold first batch, far too slow
    for _ in range(STALE_AFTER + 1):
        service.observe(4, 0.004)
    assert service.expected(32) == pytest.approx(0.032)  # from batch 4's rate, not the cold one


def test_each_size_is_forgotten_at_the_batch_it_goes_stale_and_not_one_before() -> None:
    # The sizes are looked through only once one can be stale: the same batches forget them.
    service = ServiceTimes()
    service.observe(8, 0.1)  # batch 1: stale from batch 2 + STALE_AFTER
    service.observe(2, 0.002)  # batch 2: stale from batch 3 + STALE_AFTER
    for _ in range(STALE_AFTER - 1):  # batches 3 .. STALE_AFTER + 1
        service.observe(4, 0.004)
    assert service.expected(8) == pytest.approx(0.1)
    service.observe(4, 0.004)  # batch STALE_AFTER + 2
    assert service.expected(8) == pytest.approx(0.008)  # from batch 4's rate
    assert service.expected(2) == pytest.approx(0.002)
    service.observe(4, 0.004)  # batch STALE_AFTER + 3
    assert service.expected(2) == pytest.approx(0.004)  # below the smallest known: its time


# -- off, and a lone tenant ------------------------------------------------------------------------


def test_off_until_a_tenant_has_qos_and_off_batches_hold_slots() -> None:
    device = _device(Tenant("plain", max_rows=8))
    assert not device.active
    first = device.start_off("plain")
    assert first == Grant("plain", 8, "off", 0.0)
    device.join(_tenant("guarded", 0.001, objective_s=0.05))
    assert device.active
    device.ask("guarded", Demand(0.0, 1))
    assert device.decide(0.0) is None  # the off batch still holds the only slot
    device.finish(first, 8, 0.004)
    grant = device.decide(0.004)
    assert grant is not None and grant.tenant == "guarded"


def test_a_lone_waiting_batch_goes_at_once_uncapped() -> None:
    device = _device(_tenant("a", 0.001))
    device.ask("a", Demand(0.0, 12))
    assert device.decide(0.0) == Grant("a", 32, "fair", pytest.approx(0.012))
    assert device.decide(0.0) is None  # one slot, taken


# -- fair shares -----------------------------------------------------------------------------------


def _busy(device: DeviceScheduler, batches: int, seconds: float) -> dict[str, float]:
    """Every tenant always has a full batch waiting; returns device seconds by tenant."""
    used = dict.fromkeys(device.tenants, 0.0)
    now = 0.0
    for _ in range(batches):
        for name, tenant in device.tenants.items():
            if tenant.waiting is None:
                device.ask(name, Demand(now, tenant.max_rows))
        grant = device.decide(now)
        assert grant is not None
        device.finish(grant, device.tenants[grant.tenant].max_rows, seconds)
        used[grant.tenant] += seconds
        now += seconds
    return used


def test_weights_share_device_time() -> None:
    device = _device(_tenant("big", 0.001, weight=3.0), _tenant("small", 0.001, weight=1.0))
    used = _busy(device, 400, 0.032)
    assert used["big"] / used["small"] == pytest.approx(3.0, rel=0.05)


def test_idleness_banks_no_credit() -> None:
    a, b = _tenant("a", 0.001), _tenant("b", 0.001)
    device = _device(a, b)
    device.leave("b")
    _busy(device, 100, 0.032)  # a alone for 100 batches
    device.join(b)
    used = _busy(device, 20, 0.032)
    assert used["a"] == used["b"]  # b starts level with a: no run of 100 batches of its own


def test_a_batch_granted_but_never_sent_is_not_charged() -> None:
    device = _device(_tenant("a", 0.001))
    device.ask("a", Demand(0.0, 32))
    grant = device.decide(0.0)
    assert grant is not None and grant.charged > 0
    device.finish(grant, 0, 0.0)
    assert device.tenants["a"].virtual == pytest.approx(0.0)
    assert device.running == 0


# -- objectives ------------------------------------------------------------------------------------


def _pair(protected_ahead: float = 0.005) -> DeviceScheduler:
    """A best-effort flood "n" (1 ms a row) and "p" (2 ms a row, p99 objective 10 ms).

    `p` has used more device time than `n` (its fair-share clock is ahead), so that `n` is
    the fair choice whenever both wait.
    """
    device = _device(
        _tenant("n", 0.001),
        _tenant("p", 0.002, max_rows=4, objective_s=0.010, queue_delay_s=0.001),
    )
    device.tenants["p"].virtual = protected_ahead
    return device


def test_a_tenant_about_to_miss_goes_before_the_fair_choice() -> None:
    device = _pair()
    device.ask("n", Demand(0.0, 32))
    device.ask("p", Demand(0.0, 1))  # latest start: 10 ms - 2 ms = 8 ms
    grant = device.decide(0.0075)  # slack 0.5 ms: even one row of n (1 ms) would make it miss
    assert grant is not None and (grant.tenant, grant.decision) == ("p", "urgent")


def test_with_slack_the_fair_choice_goes_capped_to_the_slack() -> None:
    device = _pair()
    device.ask("n", Demand(0.0, 32))
    device.ask("p", Demand(0.0, 1))
    grant = device.decide(0.0)  # p's slack: 8 ms, n's 8 rows take 8 ms
    assert grant == Grant("n", 8, "fair", pytest.approx(0.008))


def test_an_idle_objective_caps_the_others_to_its_queue_budget() -> None:
    device = _pair()
    device.ask("n", Demand(0.0, 32))
    grant = device.decide(0.0)  # a p request may arrive now: 10 - 2 (its batch) - 1 (delay)
    assert grant is not None and grant.max_rows == 7
    assert device.tenants["p"].budget() == pytest.approx(0.008)


def test_an_objective_is_no_licence_to_exceed_the_share() -> None:
    device = _pair(protected_ahead=0.5)  # p is far ahead of its share
    device.ask("n", Demand(0.0, 32))
    device.ask("p", Demand(0.0, 1))
    grant = device.decide(0.0075)
    assert grant == Grant("n", 1, "fair", pytest.approx(0.001))  # capped to one row, no less


def test_without_objectives_nothing_is_capped() -> None:
    device = _device(_tenant("n", 0.001), _tenant("m", 0.001))
    device.ask("n", Demand(0.0, 32))
    grant = device.decide(0.0)
    assert grant is not None and grant.max_rows == 32


# -- a flood beside a protected tenant, simulated ----------------------------------------------


def _flood(protected_every: float, until: float) -> tuple[list[float], int, float]:
    """A flood "n" (2 ms + 1 ms a row, up to 64 rows) beside "p" (4 ms a request, p99 20 ms).

    `p`'s requests arrive every `protected_every` seconds; `n` always has 64 rows waiting.
    Batches take exactly their learned times. Returns p's latencies, n's rows, the end time.
    """
    n = Tenant("n", max_rows=64, qos=True, service=_times({1: 0.003, 64: 0.066}))
    p = Tenant("p", max_rows=1, qos=True, objective_s=0.020, service=_times({1: 0.004}))
    device = _device(n, p)
    arrivals = [k * protected_every + 0.0013 * (k % 7) for k in range(int(until / protected_every))]
    queue: list[float] = []
    latencies, rows_done, now = [], 0, 0.0
    running: tuple[Grant, int, float] | None = None  # the grant, its rows, its end
    while arrivals or queue or running:
        end = running[2] if running else float("inf")
        if arrivals and arrivals[0] <= end:
            now = arrivals.pop(0)
            queue.append(now)
        else:
            grant, rows, now = running  # type: ignore[misc]
            seconds = 0.004 if grant.tenant == "p" else 0.002 + 0.001 * rows
            device.finish(grant, rows, seconds)
            if grant.tenant == "p":
                latencies.append(now - queue.pop(0))
            else:
                rows_done += rows
            running = None
        if queue and p.waiting is None and not p.running:
            device.ask("p", Demand(queue[0], 1))
        if now < until and n.waiting is None and not n.running:
            device.ask("n", Demand(now, 64))
        grant = device.decide(now)
        if grant is not None:
            rows = 1 if grant.tenant == "p" else min(64, grant.max_rows)
            seconds = 0.004 if grant.tenant == "p" else 0.002 + 0.001 * rows
            running = (grant, rows, now + seconds)
    return latencies, rows_done, now


def test_the_protected_tenant_holds_its_objective_and_the_flood_gets_the_rest() -> None:
    latencies, rows, end = _flood(protected_every=0.025, until=10.0)
    assert max(latencies) <= 0.020 + 1e-9  # every request, not only the p99
    alone = 64 / 0.066  # n's rows per second with the device to itself
    protected_share = 0.004 / 0.025
    assert rows / end >= 0.8 * alone * (1 - protected_share)


def test_a_measured_tail_above_the_objective_shrinks_the_others_batches() -> None:
    device = _pair()
    p = device.tenants["p"]
    assert p.tail.margin == 0.0
    for _ in range(TAIL_EVERY):  # its requests take 14 ms against 10: its own queueing
        p.tail.observe(0.014, 0.010, 0.0035)
    assert p.tail.margin == pytest.approx(TAIL_GAIN * (0.014 - TAIL_AIM * 0.010))
    device.ask("n", Demand(0.0, 32))
    grant = device.decide(0.0)  # idle slack: 10 - 2 - 1 - 1.25 ms
    assert grant is not None and grant.max_rows == 5
    for _ in range(8 * TAIL_EVERY):  # then well inside it again: the margin goes back to 0
        p.tail.observe(0.004, 0.010, 0.0035)
    assert p.tail.margin == 0.0


def test_finished_batches_feed_the_objective_back() -> None:
    device = _pair()
    device.ask("p", Demand(0.0, 1))
    grant = device.decide(0.0)
    assert grant is not None
    device.finish(grant, 1, 0.002, latencies=[0.030] * TAIL_EVERY)
    # Far above the objective: the margin takes what it may, half of the queue budget (10 ms
    # less its 2 ms batch and 1 ms delay), and no more.
    assert device.tenants["p"].tail.margin == pytest.approx(TAIL_CEILING * 0.007)
