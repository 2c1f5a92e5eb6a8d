"""`dlscale bench interference`: a latency-sensitive tenant alone, then beside a noisy neighbor.

Each repetition measures the protected model alone (LoadGen's Server scenario at a fixed rate)
and the neighbor alone (a closed-loop flood), then both at once under each condition, in an
order that alternates between repetitions: in process, the device scheduler off and on (one
repository, two ModelManagers); against servers, as served (and a second, --no-qos server);
with --mig, each tenant served on its own MIG instance. docs/qos.md says how to read it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dlscale.bench.flood import FloodLog, flood
from dlscale.bench.latency import summarize
from dlscale.bench.loadgen import LoopThread
from dlscale.bench.progress import Steps
from dlscale.bench.results import RunResult
from dlscale.bench.scenarios import Scenario
from dlscale.bench.session import BenchOptions, Session
from dlscale.bench.targets import BatchTimes, InProcessTarget
from dlscale.bench.tenants import (
    TenantServer,
    TenantSpec,
    configured_qos,
    mig_pair,
    scratch_repository,
)
from dlscale.errors import BenchError
from dlscale.hardware.detect import detect
from dlscale.models.config_sections import QosConfig
from dlscale.serving.manager import ModelManager
from dlscale.serving.qos.gate import DeviceGates

#: Seconds the neighbor floods before a measurement starts.
RAMP_S = 1.0


@dataclass
class InterferenceOptions:
    """What the command line asked for, typed."""

    protected: str
    neighbor: str
    repo: Path | None = None
    #: Servers: the one to measure (QoS as it serves), then optionally one started --no-qos.
    urls: tuple[str, ...] = ()
    rate: float | None = None  # the protected tenant's requests/s (default: a quarter of peak)
    objective_s: float | None = None  # its p99 objective, over its config's
    duration_s: float = 10.0
    repeats: int = 3
    concurrency: int | None = None  # the neighbor's requests in flight
    neighbor_batch: int | None = None  # rows in each of its requests (in process default 1)
    mig: bool = False
    seed: int = 0
    min_queries: int = 100
    alone_only: bool = False  # only the alone phases (to calibrate an objective)

    def check(self) -> None:
        """Refuse contradictory settings before anything is loaded."""
        if self.protected == self.neighbor:
            raise BenchError("the protected model and its neighbor must be two models")
        if not self.urls and self.repo is None:
            raise BenchError("give --repo REPO (in process), or the server URL to measure")
        if len(self.urls) > 2:
            raise BenchError("at most two servers: the one to measure and one started --no-qos")
        if self.mig and self.repo is None:
            raise BenchError("--mig serves each tenant itself: give --repo REPO")
        if self.repeats < 1 or self.duration_s <= 0 or (self.rate is not None and self.rate <= 0):
            raise BenchError("--repeats, --duration and --rate must be positive")


@dataclass
class Tenants:
    """One condition's two sessions: the protected tenant's and its neighbor's."""

    condition: str
    protected: Session
    neighbor: Session


@dataclass
class Phase:
    """One measurement: the protected tenant's Server run and/or the neighbor's flood."""

    condition: str  # alone, off, on, served, mig alone, mig
    repetition: int
    latency_s: dict[str, float | None] = field(default_factory=dict)
    throughput: float | None = None
    valid: bool | None = None
    errors: int = 0
    duration_s: float | None = None
    protected_device_s: float | None = None  # device time its batches took (statistics)
    neighbor_rate: float | None = None  # the flood's rows per second
    neighbor_errors: int = 0
    neighbor_first_error: str = ""
    load_average: float | None = None  # the host's, at the end: how busy the machine was

    @property
    def p99_s(self) -> float | None:
        return self.latency_s.get("p99")

    def to_dict(self) -> dict[str, Any]:
        """As JSON values."""
        return {**self.__dict__, "p99_s": self.p99_s}


@dataclass
class Setup:
    """The conditions and what the run holds to: the objective, its source, notes."""

    conditions: list[Tenants]
    objective_s: float | None
    objective_source: str
    notes: list[str] = field(default_factory=list)


def run_interference(
    options: InterferenceOptions, out_dir: Path
) -> tuple[Setup, list[Phase], float]:
    """Every repetition's phases (and the rate the protected tenant ran at)."""
    options.check()
    out_dir.mkdir(parents=True, exist_ok=True)
    say = Steps()  # each phase said on stderr as it begins
    with contextlib.ExitStack() as stack:
        loop = stack.enter_context(contextlib.closing(LoopThread()))
        say("setting up the conditions (scratch repositories, servers where asked)")
        setup = _setup(options, loop, out_dir, stack)
        for tenants in setup.conditions:
            say(f"condition {tenants.condition}: loading and warming up both tenants")
            for session in (tenants.protected, tenants.neighbor):
                stack.callback(session.close)
                session.open()
        base = setup.conditions[0].protected
        assert base.warmup is not None
        rate = options.rate or max(1.0, round(base.warmup.throughput / 4, 1))
        phases: list[Phase] = []
        for k in range(options.repeats):
            say(
                f"repetition {k + 1}/{options.repeats}: alone, then each condition with the "
                f"neighbor flooding ({options.duration_s:g} s each, protected at {rate:g}/s)"
            )
            phases += _repetition(k, setup.conditions, rate, options, out_dir / "loadgen")
            done = phases[-1]
            say(f"repetition {k + 1} done: last phase {done.condition}, p99 {_ms(done.p99_s)}")
    return setup, phases, rate


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1e3:.2f} ms"


# -- conditions --------------------------------------------------------------------------------


def _setup(
    options: InterferenceOptions, loop: LoopThread, out_dir: Path, stack: contextlib.ExitStack
) -> Setup:
    if options.urls:
        setup = Setup([], options.objective_s, "--objective" if options.objective_s else "none")
        named = ["on", "off"] if len(options.urls) == 2 else ["served"]
        for url, name in sorted(
            zip(options.urls, named, strict=False), key=lambda p: p[1] != "off"
        ):
            _condition(setup, name, options, loop, [url, url])
        return setup
    assert options.repo is not None
    protected_qos, objective, source = _protected_qos(options)
    setup = Setup([], objective, source)
    specs = [
        TenantSpec(options.protected, protected_qos),
        TenantSpec(options.neighbor, configured_qos(options.repo, options.neighbor) or QosConfig()),
    ]
    scratch = scratch_repository(options.repo, specs, out_dir / "repository")
    for name, gates in (("off", DeviceGates(enabled=False)), ("on", DeviceGates())):
        manager = ModelManager.open(scratch, gates)
        stack.callback(loop.run, manager.close())
        _condition(setup, name, options, loop, [None, None], manager, scratch)
    if options.mig:
        _mig(options, specs, loop, out_dir, stack, setup)
    return setup


def _protected_qos(options: InterferenceOptions) -> tuple[QosConfig, float, str]:
    assert options.repo is not None
    qos = configured_qos(options.repo, options.protected) or QosConfig()
    if options.objective_s is not None:
        us = round(options.objective_s * 1e6)
        return (
            qos.model_copy(update={"latency_objective_us": us}),
            options.objective_s,
            "--objective",
        )
    if not qos.latency_objective_us:
        raise BenchError(
            f"model {options.protected!r} has no [qos] latency_objective_us: give --objective "
            "(the p99 to hold, e.g. 20ms)"
        )
    return qos, qos.latency_objective_us / 1e6, "its [qos] latency_objective_us"


def _mig(
    options: InterferenceOptions,
    specs: list[TenantSpec],
    loop: LoopThread,
    out_dir: Path,
    stack: contextlib.ExitStack,
    setup: Setup,
) -> None:
    """A condition with each tenant served on its own MIG instance, where the host has two."""
    pair = mig_pair(detect())
    if pair is None:
        setup.notes.append("--mig: this host has no two MIG instances; the MIG phases await one")
        return
    assert options.repo is not None
    urls: list[str | None] = []
    for spec, instance in zip(specs, pair, strict=True):
        placed = TenantSpec(spec.model, spec.qos, instance.uuid)
        repo = scratch_repository(options.repo, [placed], out_dir / f"mig-{spec.model}")
        log = out_dir / f"mig-{spec.model}.log"
        urls.append(stack.enter_context(TenantServer(repo, instance.uuid, log)).url)
        setup.notes.append(f"--mig: {spec.model} on {instance.profile or '?'} {instance.uuid}")
    _condition(setup, "mig", options, loop, urls)


def _condition(
    setup: Setup,
    name: str,
    options: InterferenceOptions,
    loop: LoopThread,
    urls: list[str | None],
    manager: ModelManager | None = None,
    repo: Path | None = None,
) -> None:
    """Add condition `name`: the protected tenant (urls[0]) held to the objective, the neighbor."""
    sessions = []
    for model, url in zip((options.protected, options.neighbor), urls, strict=True):
        protected = model == options.protected
        bench = BenchOptions(
            model=model,
            scenarios=[Scenario.SERVER if protected else Scenario.OFFLINE],
            repo=repo or options.repo,
            duration_s=options.duration_s,
            latency_bound_s=setup.objective_s if protected else None,
            concurrency=None if protected else options.concurrency,
            batch_size=None if protected else options.neighbor_batch,
            min_query_count=options.min_queries,
            seed=options.seed,
        )
        target = InProcessTarget(repo, model, manager=manager) if manager and repo else None
        sessions.append(Session(url, bench, loop, target))
    setup.conditions.append(Tenants(name, *sessions))


# -- measurements ------------------------------------------------------------------------------


def _repetition(
    k: int, conditions: list[Tenants], rate: float, options: InterferenceOptions, logs: Path
) -> list[Phase]:
    base, *rest = conditions
    shared = [c for c in conditions if c.condition != "mig"]
    if k % 2:
        shared.reverse()  # alternate the order: drift on a shared machine favours neither
    phases = [_alone(base, "alone", k, rate, options, logs / f"rep{k + 1}-alone")]
    if options.alone_only:
        return phases
    for tenants in shared:
        folder = logs / f"rep{k + 1}-{tenants.condition}"
        phases.append(_together(tenants, tenants.condition, k, rate, options, folder))
    for tenants in rest:
        if tenants.condition == "mig":
            folder = logs / f"rep{k + 1}-mig"
            phases.append(_alone(tenants, "mig alone", k, rate, options, folder / "alone"))
            phases.append(_together(tenants, "mig", k, rate, options, folder / "together"))
    return phases


def _alone(
    tenants: Tenants, name: str, k: int, rate: float, options: InterferenceOptions, logs: Path
) -> Phase:
    phase = _protected(tenants.protected, name, k, rate, logs)
    log, start, end = _flooding(tenants.neighbor, lambda: time.sleep(options.duration_s))
    _neighbor(phase, log, start, end)
    return phase


def _together(
    tenants: Tenants, name: str, k: int, rate: float, options: InterferenceOptions, logs: Path
) -> Phase:
    measured: list[Phase] = []

    def measure() -> None:
        measured.append(_protected(tenants.protected, name, k, rate, logs))

    log, start, end = _flooding(tenants.neighbor, measure)
    _neighbor(measured[0], log, start, end)
    return measured[0]


def _flooding(neighbor: Session, during: Any) -> tuple[FloodLog, float, float]:
    """Run `during()` while the neighbor floods (after a ramp); the flood's log and window."""
    assert neighbor.info is not None and neighbor.samples is not None
    batch, concurrency = neighbor.offline_shape()
    stop = asyncio.Event()
    job = neighbor.target, neighbor.info, neighbor.samples, batch, concurrency, stop
    running = asyncio.run_coroutine_threadsafe(flood(*job), neighbor.loop.loop)
    try:
        time.sleep(RAMP_S)
        start = time.perf_counter()
        during()
        end = time.perf_counter()
    finally:
        neighbor.loop.loop.call_soon_threadsafe(stop.set)
        log = running.result()
    return log, start, end


def _protected(session: Session, name: str, k: int, rate: float, logs: Path) -> Phase:
    before = session.loop.run(session.target.batch_times())
    run: RunResult = session.run(session.settings(Scenario.SERVER, rate), logs)
    after = session.loop.run(session.target.batch_times())
    return Phase(
        condition=name,
        repetition=k + 1,
        latency_s=summarize(run.latencies_ns),
        throughput=run.throughput,
        valid=run.valid,
        errors=run.errors,
        duration_s=run.duration_s,
        protected_device_s=_device_seconds(before, after),
    )


def _neighbor(phase: Phase, log: FloodLog, start: float, end: float) -> None:
    phase.load_average = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    phase.neighbor_rate = log.rate(start, end)
    phase.neighbor_errors = log.errors
    phase.neighbor_first_error = log.first_error


def _device_seconds(before: BatchTimes | None, after: BatchTimes | None) -> float | None:
    """Compute time the model's batches took between two statistics readings."""
    if before is None or after is None:
        return None
    total = sum(ns for _, ns in after.values()) - sum(ns for _, ns in before.values())
    return total / 1e9
