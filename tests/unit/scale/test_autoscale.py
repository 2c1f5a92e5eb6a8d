"""The autoscaler's plumbing (scale/autoscale.py, scale/fleet.py): a real server's counters
become each model's figures, Ray Serve's context reaches the rule and every decision is logged
with its figures, and a stopping replica leaves the router only after its last heartbeat."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import tritonclient.http as th
from tests.toolkit.generative import write_colours
from tests.toolkit.repositories import OBJECTIVE_US, tenants_repository
from tests.toolkit.server import LocalServer, free_port, serving

from dlscale.scale.autoscale import (
    DOWN_SINCE,
    JOINED,
    LAST,
    PREFIX,
    REPORTED,
    STARTS,
    Counters,
    FleetPolicy,
    Reading,
    autoscaling_config,
    figures,
    instances,
    loads,
    read,
    reporting,
)
from dlscale.scale.figures_reader import KEPT_S, READ_S, FiguresReader
from dlscale.scale.objective import DOWN_DELAY_S
from dlscale.scale.starts import LOOK_BACK_S, Starts

REQUESTS = 16
#: The policy as Ray Serve's controller makes it, with no router to tell its decisions.
fleet_policy = FleetPolicy()


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tenants_repository(tmp_path_factory.mktemp("autoscale"))


@pytest.fixture(scope="module")
def server(repo: Path) -> Iterator[LocalServer]:
    with serving(repo, metrics_port=0) as running:
        yield running


def _reading(server: LocalServer) -> Reading:
    base = f"http://{server.http_url}"
    stats = httpx.get(f"{base}/v2/models/stats", timeout=30).json()
    page = httpx.get(f"http://127.0.0.1:{server.server.ports['metrics']}/metrics", timeout=30)
    return read(time.monotonic(), stats, page.text)


def _infer(client: th.InferenceServerClient, model: str) -> Any:
    x = th.InferInput("x", [1, 4], "FP32")
    x.set_data_from_numpy(np.ones((1, 4), np.float32))
    return client.async_infer(model, [x])


def test_a_replicas_report_is_each_models_figures_over_the_interval(
    server: LocalServer, http: th.InferenceServerClient, repo: Path
) -> None:
    before = _reading(server)
    # 8 at once (the client's connections) on a model of one instance and batches of one.
    calls = [_infer(http, "protected") for _ in range(REQUESTS)]
    for call in calls:
        call.get_result()
    _infer(http, "neighbor").get_result()
    after = _reading(server)
    report = figures(before, after, instances(repo, list(after.models)))
    key = f"{PREFIX}/{{}}/protected".format
    span = after.at - before.at
    assert report[key("rate")] == pytest.approx(REQUESTS / span)
    assert report[key("objective_s")] == OBJECTIVE_US / 1e6
    assert report[key("wait_s")] > 0  # eight at once on one instance: all but one queued
    assert 0 < report[key("busy")] <= 1
    assert report[key("in_flight")] == 0 and report[key("growth")] == 0  # all answered
    # One instance at its best time per row: at least the rate it answered.
    assert report[key("capacity")] >= report[key("rate")] > 0
    assert report[f"{PREFIX}/objective_s/neighbor"] == 0  # no objective: the in-flight rule
    # Two replicas reporting the same: the fleet's rate adds up, its wait and busy do not.
    per_replica = {k: {"r1": v, "r2": v} for k, v in report.items()}
    [neighbor, protected] = loads(per_replica)
    assert (neighbor.model, neighbor.objective_s) == ("neighbor", 0.0)
    assert protected.rate == pytest.approx(2 * report[key("rate")])
    assert protected.wait_s == pytest.approx(report[key("wait_s")])
    assert protected.busy == pytest.approx(report[key("busy")])
    assert protected.capacity == pytest.approx(report[key("capacity")])  # one replica's


def test_a_replica_reports_how_fast_its_queue_grew() -> None:
    # 2 held, then 8 held two seconds later: 3 requests/s more arrived than were answered.
    counters = Counters(requests=10.0, queue_s=1.0, row_s=0.05, in_flight=2.0)
    grown = replace(counters, requests=50.0, queue_s=5.0, in_flight=8.0)
    report = figures(Reading(0.0, {"m": counters}), Reading(2.0, {"m": grown}), {"m": 2})
    assert report[f"{PREFIX}/growth/m"] == 3.0
    assert report[f"{PREFIX}/capacity/m"] == 40.0  # 2 instances at 50 ms a row
    [load] = loads({k: {"r1": v, "r2": v} for k, v in report.items()})
    assert load.growth == 6.0 and load.arrival == 2 * 20.0 + 6.0  # answered and kept


TTFT_OBJECTIVE_US, TPOT_OBJECTIVE_US = 500_000, 50_000


@pytest.fixture(scope="module")
def generative(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalServer]:
    """The colours model (generative, Python) with TTFT and TPOT objectives, and a classic one."""
    root = tmp_path_factory.mktemp("autoscale-generative")
    folder = write_colours(root)
    toml = folder / "config.toml"
    objectives = f"ttft_objective_us = {TTFT_OBJECTIVE_US}\ntpot_objective_us = {TPOT_OBJECTIVE_US}"
    toml.write_text(toml.read_text() + f"[qos]\n{objectives}\n")
    with serving(root, grpc_port=None, metrics_port=0) as running:
        yield running


def test_a_generative_replica_reports_its_mean_ttft_and_tpot_and_their_objectives(
    generative: LocalServer, caplog: pytest.LogCaptureFixture
) -> None:
    before = _reading(generative)
    body = {"text_input": "one two three", "parameters": {"max_tokens": 6}}
    url = f"http://{generative.http_url}/v2/models/colours/generate"
    for _ in range(3):
        assert httpx.post(url, json=body, timeout=60).status_code == 200
    after = _reading(generative)
    report = figures(before, after, {})
    key = f"{PREFIX}/{{}}/colours".format
    assert report[key("ttft_objective_s")] == TTFT_OBJECTIVE_US / 1e6
    assert report[key("tpot_objective_s")] == TPOT_OBJECTIVE_US / 1e6
    # Means over the interval: each request's first token came within it, and later tokens.
    assert 0 < report[key("ttft_s")] < after.at - before.at
    assert 0 < report[key("tpot_s")] < after.at - before.at
    assert report[key("rate")] == pytest.approx(3 / (after.at - before.at))
    [load] = loads({k: {"r1": v} for k, v in report.items()})
    assert load.ttft_s == pytest.approx(report[key("ttft_s")])
    assert load.tpot_s == pytest.approx(report[key("tpot_s")])
    # The same interval read again holds no new request: no TTFT, not the old one.
    again = figures(after, _reading(generative), {})
    assert again[key("ttft_s")] == 0 and again[key("tpot_s")] == 0
    with caplog.at_level(logging.INFO, logger="dlscale.scale"):
        wanted, state = fleet_policy(_context({k: {"r1": v} for k, v in report.items()}, 2, {}))
    assert wanted == 2 and "colours.ttft_objective_ms=500" in state[LAST]  # well within


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


async def test_the_replica_answers_ray_with_the_last_figures_read_and_drops_old_ones(
    server: LocalServer, http: th.InferenceServerClient, repo: Path
) -> None:
    base, metrics = f"http://{server.http_url}", server.server.ports["metrics"]
    clock = _Clock()
    reader = FiguresReader(
        f"{base}/v2/models/stats", f"http://127.0.0.1:{metrics}/metrics", repo, clock
    )
    try:
        await reader.read_once()
        assert reader.latest() == {}  # one reading covers no interval yet
        for call in [_infer(http, "protected") for _ in range(4)]:
            call.get_result()
        clock.now += 2.0
        await reader.read_once()
        read = reader.latest()
        assert read[f"{PREFIX}/rate/protected"] == pytest.approx(4 / 2.0)
        # The server stops answering: the figures read stay reported for KEPT_S, then none.
        reader.stats_url = f"http://127.0.0.1:{free_port()}/v2/models/stats"
        with pytest.raises(httpx.ConnectError):
            await reader.read_once()
        clock.now += KEPT_S
        assert reader.latest() == read
        clock.now += 1.0
        assert reader.latest() == {}
        # Its task logs each failed reading, keeps trying, and stops when told.
        stop = asyncio.Event()
        task = asyncio.create_task(reader.run(stop))
        await asyncio.sleep(2 * READ_S)
        stop.set()
        await asyncio.wait_for(task, 30)
        assert reader.latest() == {} and not task.exception()
    finally:
        await reader._client.aclose()
    # Nobody asked for KEPT_S (Ray stopped: the fleet was redeployed fixed): the reading stops.
    unasked = FiguresReader(reader.stats_url, reader.metrics_url, repo, clock)
    clock.now += KEPT_S + 1.0
    await asyncio.wait_for(unasked.run(asyncio.Event()), 30)


def test_a_model_the_repository_cannot_describe_counts_one_instance(repo: Path) -> None:
    assert instances(repo, ["protected", "missing"]) == {"protected": 1, "missing": 1}


def _context(
    metrics: dict[str, dict[str, float]], running: int, state: dict[str, Any], target: int = 0
) -> Any:
    pytest.importorskip("ray", reason="the policy runs in Ray Serve's controller")
    from ray.serve._private.common import DeploymentID
    from ray.serve.config import AutoscalingConfig, AutoscalingContext

    config = AutoscalingConfig(**autoscaling_config(1, 4, 8.0))
    return AutoscalingContext(
        deployment_id=DeploymentID(name="FleetReplica", app_name="dlscale"),
        deployment_name="FleetReplica", app_name="dlscale", current_num_replicas=running,
        target_num_replicas=target or running, running_replicas=[], total_num_requests=0.0,
        total_queued_requests=0.0, aggregated_metrics=metrics, raw_metrics={},
        capacity_adjusted_min_replicas=1, capacity_adjusted_max_replicas=4, policy_state=state,
        last_scale_up_time=None, last_scale_down_time=None, current_time=1000.0, config=config,
    )  # fmt: skip


def _reported(
    wait_s: float, busy: float, in_flight: float = 0.0, replicas: int = 2
) -> dict[str, dict[str, float]]:
    """Each replica's report, each answering 50 requests/s, holding `in_flight`."""
    one = {"rate": 50.0, "wait_s": wait_s, "busy": busy, "in_flight": in_flight}
    one["objective_s"] = 0.02
    names = [f"r{i}" for i in range(replicas)]
    aggregated = {f"{PREFIX}/{k}/m": dict.fromkeys(names, v) for k, v in one.items()}
    return aggregated | {REPORTED: dict.fromkeys(names, 1.0)}


def test_the_policy_scales_on_the_objective_and_logs_its_figures(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.INFO, logger="dlscale.scale"):
        # Each holds 0.75: the queue a 15 ms wait at 50 requests/s holds (Little's law).
        wanted, state = fleet_policy(_context(_reported(0.015, 0.7, 0.75), 2, {}))
    assert wanted > 2
    [line] = [r.getMessage() for r in caplog.records if "autoscaler" in r.getMessage()]
    assert line.startswith(f"autoscaler: 2 -> {wanted} replicas: m: wait 15 ms")
    assert "m.wait_ms=15" in line and "m.objective_ms=20" in line and "m.busy=0.7" in line
    assert state[LAST] == line.removeprefix("autoscaler: ")


def test_the_policy_holds_an_idle_fleet_in_its_state_then_sheds(
    caplog: pytest.LogCaptureFixture,
) -> None:
    idle = _reported(0.0, 0.05, replicas=3)
    with caplog.at_level(logging.INFO, logger="dlscale.scale"):
        wanted, state = fleet_policy(_context(idle, 3, {}))
        assert wanted == 3 and state[DOWN_SINCE] == 1000.0  # Ray's clock, kept for next time
        again, state = fleet_policy(_context(idle, 3, state))
        assert again == 3
        state[DOWN_SINCE] -= 3600.0  # an hour of idle
        shed, state = fleet_policy(_context(idle, 3, state))
    assert shed == 1 and state[DOWN_SINCE] is None  # straight to what 1 would hold
    lines = [r.getMessage() for r in caplog.records if "autoscaler" in r.getMessage()]
    assert len(lines) == 2  # the hold's start and the decision, not every run
    assert f"held 0 of {DOWN_DELAY_S:g} s" in lines[0]
    assert lines[1].startswith("autoscaler: 3 -> 1 replicas")


def test_a_hold_that_ends_without_its_scale_down_is_logged_with_why(
    caplog: pytest.LogCaptureFixture,
) -> None:
    idle = _reported(0.0, 0.05, replicas=3)
    held_up = _reported(0.0, 0.6, replicas=3)  # two would be 0.9 busy
    with caplog.at_level(logging.INFO, logger="dlscale.scale"):
        _, state = fleet_policy(_context(idle, 3, {}))  # a hold begins
        kept, state = fleet_policy(_context(held_up, 3, state))  # the load is back: it ends
        again, state = fleet_policy(_context(held_up, 3, state))  # nothing new: no line
    assert kept == again == 3 and state[DOWN_SINCE] is None
    lines = [r.getMessage() for r in caplog.records if "autoscaler" in r.getMessage()]
    assert len(lines) == 2 and "held 0 of" in lines[0]
    assert lines[1].startswith("autoscaler: 3 -> 3 replicas: m: ") and "not fewer" in lines[1]


def test_no_replica_goes_on_figures_some_replicas_did_not_report(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Ray's aggregate held no figure of one replica (its server too slow to read beside two
    # burners): read as idle, the fleet went 2 -> 1 under load. It holds until both report.
    idle = _reported(0.0, 0.05)
    with caplog.at_level(logging.INFO, logger="dlscale.scale"):
        r0_only = {k: {"r0": v["r0"]} for k, v in idle.items()}
        for partial, count in (({}, 0), (r0_only, 1)):
            wanted, state = fleet_policy(_context(partial, 2, {DOWN_SINCE: 0.0}))
            assert wanted == 2 and state[DOWN_SINCE] is None
            assert f"not fewer: figures from {count} of 2 replicas" in state[LAST]
        state[DOWN_SINCE] = 0.0  # a hold long past, and every replica reports: it sheds
        shed, state = fleet_policy(_context(idle, 2, state))
    assert shed == 1


def test_a_report_marks_its_replica_even_with_no_model() -> None:
    assert figures(Reading(0.0, {}), Reading(1.0, {}), {}) == {REPORTED: 1.0}
    assert figures(Reading(1.0, {}), Reading(1.0, {}), {}) == {}  # no interval: no report
    assert reporting({REPORTED: {"r0": 1.0, "r1": 1.0}, f"{PREFIX}/rate/m": {"r2": 1.0}}) == 2


def test_a_warming_replica_does_not_lower_the_fleets_capacity() -> None:
    # r2 joined in a burst and has run batches of one only: it reads half r1's capacity (and
    # twice its busy share at its rate). The replicas run the same model: r1's best holds.
    reported = {
        f"{PREFIX}/rate/m": {"r1": 16.0, "r2": 4.0},
        f"{PREFIX}/busy/m": {"r1": 0.8, "r2": 0.4},
        f"{PREFIX}/capacity/m": {"r1": 20.0, "r2": 10.0},
        f"{PREFIX}/objective_s/m": {"r1": 1.0, "r2": 1.0},
    }
    [load] = loads(reported)
    assert load.capacity == 20.0 and load.busy == (16.0 + 4.0) / 20.0 / 2


def test_the_policy_keeps_when_replicas_last_started_in_its_state() -> None:
    saturated = _reported(2.0, 1.0, in_flight=200.0)  # 400 held: 4 drain it (100 + 80) / 50
    wanted, state = fleet_policy(_context(saturated, 2, {}, target=3))
    assert wanted == 3 and state[JOINED] == 1000.0 and "1 replica(s) starting" in state[LAST]
    wanted, state = fleet_policy(_context(saturated, 3, state))  # all run, figures not yet
    assert wanted == 3 and state[JOINED] == 1000.0
    state[JOINED] -= LOOK_BACK_S
    wanted, state = fleet_policy(_context(saturated, 3, state))
    assert wanted > 3 and state[JOINED] is None


def test_the_policy_keeps_how_long_its_latest_replica_took_to_start() -> None:
    # Seen starting at 997 s (a start kept in the state), every replica runs at 1000 s.
    state = {STARTS: Starts(asked=997.0).kept()}
    wanted, state = fleet_policy(_context(_reported(0.0, 0.05, replicas=3), 3, state))
    assert Starts.from_kept(state[STARTS]) == Starts(None, 3.0)
    assert wanted == 3 and "held 0 of 24 s" in state[LAST]  # 3 x (5 + 3), not 30


def test_replicas_with_no_objective_keep_the_in_flight_target() -> None:
    reported = _reported(1.0, 0.9, in_flight=9.0)
    reported[f"{PREFIX}/objective_s/m"] = {"r1": 0.0, "r2": 0.0}
    assert fleet_policy(_context(reported, 1, {}))[0] == 3  # 18 in flight, 8 each


class _Router:
    """Stands in for the router actor's handle: each call runs on its own, as an actor's does,
    and cancelling the caller's wait does not stop it (a Ray ObjectRef's behaviour)."""

    def __init__(self) -> None:
        self.said: list[str] = []
        self.beats = asyncio.Event()

    def __getattr__(self, method: str) -> Any:
        router = self

        class _Method:
            @staticmethod
            def remote(*args: Any) -> asyncio.Future[Any]:
                answer = asyncio.get_running_loop().create_future()
                asyncio.get_running_loop().create_task(router._run(method, answer))
                return answer

        return _Method()

    async def _run(self, method: str, answer: asyncio.Future[Any]) -> None:
        if method == "heartbeat":
            self.beats.set()
            await asyncio.sleep(0.2)  # a busy router: the beat is still on its way
        self.said.append(method)
        if not answer.cancelled():
            answer.set_result(0)


class _Child:
    def alive(self) -> bool:
        return True


async def test_a_stopping_replica_leaves_the_router_after_its_last_heartbeat() -> None:
    pytest.importorskip("ray", reason="the replica is a Ray Serve deployment")
    from dlscale.scale.fleet import FleetReplica

    class Replica(FleetReplica):
        def __del__(self) -> None:  # type: ignore[override]
            """Ray Serve's async stop awaits `drain`, tested here; nothing to stop."""

    replica = Replica.__new__(Replica)
    router = _Router()
    replica.key, replica.node, replica.entries, replica.ready = "r1", "n1", [], True
    replica.router, replica.child = router, _Child()
    replica.endpoint = None  # type: ignore[assignment]
    replica._leaving = asyncio.Event()
    replica._beat = asyncio.get_running_loop().create_task(replica._heartbeat())
    await asyncio.wait_for(router.beats.wait(), 30)
    await replica.drain()
    await asyncio.sleep(0.4)  # anything still on its way arrives
    assert router.said[-1] == "leave", router.said  # nothing may put it back in rotation


def test_rays_wrapper_applies_the_rules_decision_and_keeps_its_state() -> None:
    ctx = _context(_reported(0.015, 0.7, 0.75), 2, {})
    from ray.serve.autoscaling_policy import _apply_autoscaling_config

    wrapped = _apply_autoscaling_config(fleet_policy)  # as Ray Serve's controller runs it
    assert wrapped(ctx)[0] == fleet_policy(ctx)[0] > 2  # Ray's own delays are zero
    held, state = wrapped(_context(_reported(0.0, 0.05, replicas=3), 3, {}))
    assert held == 3 and state[DOWN_SINCE] == 1000.0
    assert wrapped(_context(_reported(0.0, 0.05, replicas=3), 3, state))[1][DOWN_SINCE] == 1000.0


def test_rays_controller_makes_the_fleets_policy_with_its_down_delay() -> None:
    pytest.importorskip("ray", reason="the policy runs in Ray Serve's controller")
    from ray.serve._private.autoscaling_state import _resolve_policy_callable
    from ray.serve.config import AutoscalingConfig

    config = AutoscalingConfig(**autoscaling_config(1, 4, 8.0, down_delay_s=5.0))
    policy = _resolve_policy_callable(config.policy)  # as the controller makes it, once
    assert isinstance(policy, FleetPolicy) and policy.down_delay_s == 5.0
    held, state = policy(_context(_reported(0.0, 0.05, replicas=3), 3, {}))
    assert held == 3 and "held 0 of 5 s" in state[LAST]
