"""SLO tuning: the batch size, queue delay and instance count with the highest Server rate
whose p99 latency stays under a bound, found by branch and bound over measured service times.

How the search prunes (docs/optimize.md tells it at more length):

1. Service times: one backend per instance count k (intra-op threads = cores / k) runs
   batches of 1, 2, 4 ... max_batch_size directly, without the server: t_k(b).
2. Infeasible points go: a point whose full batch alone breaks the bound (queue delay plus
   2 · t_k(b): a request may wait for the batch in flight, then run in its own) is not run.
3. Each remaining point gets an optimistic ceiling, k · b / t_k(b) samples per second (its
   instances computing full batches side by side, nothing else in the way).
4. Points are measured best ceiling first, each by a LoadGen Server find-peak through the
   in-process batcher; a point whose ceiling is below the best peak measured so far cannot
   win and is pruned, as are the points left when the time budget or `max_points` runs out.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from dlscale.backends import create_backend
from dlscale.bench.results import RunResult, ScenarioResult
from dlscale.bench.scenarios import Scenario
from dlscale.bench.session import BenchOptions, opened
from dlscale.errors import OptimizeError
from dlscale.models.config import ModelConfig, write_config
from dlscale.models.repository import ModelRepository, ModelVersion
from dlscale.models.runner import load_for_run, options_for, time_backend
from dlscale.models.signature import reconcile
from dlscale.optimize.data import Arrays, load_datasets
from dlscale.optimize.staging import backend_options_of, derived_config, stage
from dlscale.optimize.variants import DeviceCaps

Progress = Callable[[str], None]
#: A batch size whose ceiling reaches this share of the best is the knee of the curve.
KNEE = 0.9


@dataclass(frozen=True)
class SloSettings:
    """How hard the tuner looks: run lengths, how many points get a find-peak, the margin."""

    #: Seconds of each LoadGen Server run inside a find-peak.
    run_seconds: float = 2.0
    #: LoadGen Server runs per find-peak (ramp and bisection).
    max_peak_runs: int = 6
    #: Points measured at most (the best ceilings first).
    max_points: int = 4
    #: Queries at least per Server run.
    min_queries: int = 128
    #: Seconds the time spent per batch size is measured for the service-time model.
    timing_s: float = 0.2
    #: The tuned rate is this share of the peak: headroom for run-to-run noise.
    rate_share: float = 0.9
    verify_seconds: float = 4.0
    #: A verification run that misses the bound is repeated this many times in all, each at
    #: `step_down` times the last rate.
    verify_attempts: int = 3
    step_down: float = 0.7


@dataclass(frozen=True)
class ServingPoint:
    """One serving configuration: instances, their threads, batch cap and queue delay."""

    instances: int
    threads: int
    max_batch_size: int
    max_queue_delay_us: int

    @property
    def label(self) -> str:
        return (
            f"k{self.instances}-t{self.threads}-b{self.max_batch_size}-d{self.max_queue_delay_us}"
        )


@dataclass
class PointOutcome:
    """A point's ceiling, and its measured peak when it was measured (or why not)."""

    point: ServingPoint
    ceiling_sps: float
    batch_time_ms: float
    status: str = "pruned"
    reason: str = ""
    peak_qps: float | None = None
    p99_ms: float | None = None
    sweep: list[dict[str, Any]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        rest = asdict(self)
        return {**rest.pop("point"), **rest}


@dataclass
class SloResult:
    """The tuner's outcome: every point considered, the winner, and the verification run."""

    bound_s: float
    service_ms: dict[str, dict[int, float]]
    outcomes: list[PointOutcome]
    winner: PointOutcome | None
    rate_qps: float | None = None
    verification: dict[str, Any] | None = None
    note: str = ""

    @property
    def verified(self) -> bool:
        return bool(self.verification and self.verification.get("valid"))

    def to_dict(self) -> dict[str, Any]:
        return {
            "bound_s": self.bound_s,
            "service_ms": {
                k: {str(b): t for b, t in v.items()} for k, v in self.service_ms.items()
            },
            "points": [o.to_dict() for o in self.outcomes],
            "winner": self.winner.to_dict() if self.winner else None,
            "rate_qps": self.rate_qps,
            "verification": self.verification,
            "verified": self.verified,
            "note": self.note,
        }


def tune_slo(
    repo_root: Path,
    model: str,
    bound_s: float,
    caps: DeviceCaps,
    settings: SloSettings,
    deadline: float,
    scratch: Path,
    say: Progress,
) -> SloResult:
    """Tune the newest version of `model` for the bound; the winner goes into its config.toml."""
    repo = ModelRepository(repo_root)
    version = repo.version(model)
    config = version.config
    if not config.batched:
        raise OptimizeError(f"model {model!r} takes no batch dimension: nothing to tune")
    inputs = _signature(version)
    validation = load_datasets(version, inputs).validation
    say(f"SLO p99 {bound_s * 1e3:g} ms: timing batch sizes")
    service = _service_times(version, caps, validation, settings.timing_s)
    outcomes = _candidates(service, bound_s, caps)
    result = SloResult(bound_s, {str(k): v for k, v in service.items()}, outcomes, None)
    best: PointOutcome | None = None
    measured = 0

    def try_point(outcome: PointOutcome) -> None:
        nonlocal best, measured
        if best is not None and best.peak_qps and outcome.ceiling_sps <= best.peak_qps:
            outcome.status = "pruned"
            outcome.reason = (
                f"ceiling {outcome.ceiling_sps:,.0f}/s is below the best peak found "
                f"({best.peak_qps:,.0f}/s)"
            )
            return
        if measured >= settings.max_points or time.monotonic() > deadline:
            outcome.status = "pruned"
            outcome.reason = "the time budget or max_points ran out before its turn"
            return
        measured += 1
        label = outcome.point.label.replace("-", "_")
        say(f"  find-peak for {label} (ceiling {outcome.ceiling_sps:,.0f}/s)")
        staged = _config_for(config, outcome.point, label)
        folder = stage(scratch, label, staged, version.model_file, validation, link=True)
        _peak(folder, outcome, bound_s, settings)
        if outcome.peak_qps and (best is None or outcome.peak_qps > (best.peak_qps or 0)):
            best = outcome

    for outcome in [o for o in outcomes if o.status == "candidate"]:
        try_point(outcome)
    if best is not None and (delayed := _with_delay(best, bound_s)) is not None:
        outcomes.append(delayed)
        try_point(delayed)
    result.winner = best
    if best is None or not best.peak_qps:
        result.note = "no measured point held the bound at any rate"
        return result
    write_config(_config_for(config, best.point, config.name), version.path.parent / "config.toml")
    say(f"  winner {best.point.label}: peak {best.peak_qps:,.0f}/s; verifying")
    result.rate_qps, result.verification = _verify(
        repo_root, model, bound_s, best.peak_qps, settings, scratch
    )
    return result


def _signature(version: ModelVersion) -> list[Any]:
    backend = load_for_run(version)
    try:
        inputs, _ = reconcile(version.config, backend.inputs, backend.outputs, version.path)
    finally:
        backend.unload()
    return inputs


def instance_counts(caps: DeviceCaps) -> list[int]:
    """Instance counts worth trying: powers of two up to the cores (CPU), 1 to 3 on a GPU."""
    if caps.is_cuda:
        return [1, 2, 3]
    return [1 << k for k in range(max(1, caps.cores).bit_length())]


def batch_sizes(max_batch_size: int) -> list[int]:
    """1, 2, 4 ... up to the model's max_batch_size (which is included)."""
    sizes = [1 << k for k in range(max_batch_size.bit_length()) if 1 << k < max_batch_size]
    return [*sizes, max_batch_size]


def _service_times(
    version: ModelVersion, caps: DeviceCaps, validation: Arrays, seconds: float
) -> dict[int, dict[int, float]]:
    """t_k(b) in ms: median time of one batch of b on one backend with cores / k threads."""
    out: dict[int, dict[int, float]] = {}
    rows = len(next(iter(validation.values())))
    for k in instance_counts(caps):
        threads = 0 if caps.is_cuda else max(1, caps.cores // k)
        backend = create_backend(
            version.config.backend,
            version.model_file,
            replace(options_for(version.config, caps.device), intra_op_threads=threads),
        )
        backend.load()
        try:
            times: dict[int, float] = {}
            for b in batch_sizes(version.config.max_batch_size):
                index = np.arange(b) % rows
                feed = {n: a[index] for n, a in validation.items()}
                times[b] = time_backend(backend, feed, min_seconds=seconds).median_ms
            out[k] = times
        finally:
            backend.unload()
    return out


def _candidates(
    service: dict[int, dict[int, float]], bound_s: float, caps: DeviceCaps
) -> list[PointOutcome]:
    """Every (instances, batch) point with its ceiling; the ones worth a find-peak first.

    Per instance count, two batch caps are kept: the largest feasible one and the knee (the
    smallest whose ceiling reaches KNEE of the largest's). Below the knee throughput is lost;
    between the two, the peak is bracketed by theirs. Queue delays are tried on the winner only.
    """
    bound_ms = bound_s * 1e3
    outcomes = []
    for k, times in service.items():
        threads = 0 if caps.is_cuda else max(1, caps.cores // k)
        group = [
            PointOutcome(ServingPoint(k, threads, b, 0), k * b / t * 1e3, t)
            for b, t in times.items()
        ]
        feasible = [o for o in group if 2 * o.batch_time_ms <= bound_ms]
        for o in group:
            if o not in feasible:
                o.status = "infeasible"
                o.reason = (
                    f"2 x batch time {o.batch_time_ms:.2f} ms exceeds the {bound_ms:g} ms bound"
                )
        if feasible:
            largest = max(feasible, key=lambda o: o.point.max_batch_size)
            best = max(o.ceiling_sps for o in feasible)
            knee = min(
                (o for o in feasible if o.ceiling_sps >= KNEE * best),
                key=lambda o: o.point.max_batch_size,
            )
            for o in feasible:
                if o is largest or o is knee:
                    o.status = "candidate"
                else:
                    o.reason = (
                        f"bracketed: below the knee (batch {knee.point.max_batch_size}) or "
                        f"between it and the largest feasible batch "
                        f"({largest.point.max_batch_size})"
                    )
        outcomes += group
    outcomes.sort(key=lambda o: (o.status != "candidate", -o.ceiling_sps))
    return outcomes


def _with_delay(outcome: PointOutcome, bound_s: float) -> PointOutcome | None:
    """The winner again with a queue delay that the bound leaves room for (None if none)."""
    slack_ms = bound_s * 1e3 - 2 * outcome.batch_time_ms
    delay_us = int(min(slack_ms / 2, outcome.batch_time_ms) * 1e3)
    if delay_us <= 0:
        return None
    p = outcome.point
    point = ServingPoint(p.instances, p.threads, p.max_batch_size, delay_us)
    return PointOutcome(point, outcome.ceiling_sps, outcome.batch_time_ms, status="candidate")


def _config_for(base: ModelConfig, point: ServingPoint, name: str) -> ModelConfig:
    batching = base.batching.model_dump(mode="json")
    batching["max_queue_delay_us"] = point.max_queue_delay_us
    batching["preferred_batch_sizes"] = [
        b for b in batching.get("preferred_batch_sizes", []) if b <= point.max_batch_size
    ]
    device = base.instances[0].device
    changes: dict[str, Any] = {
        "max_batch_size": point.max_batch_size,
        "batching": batching,
        "instances": [{"count": point.instances, "device": device}],
        "backend_options": backend_options_of(base, {"intra_op_threads": point.threads}),
    }
    if name == base.name:  # the tuned config keeps the model's own version policy
        changes["version_policy"] = base.version_policy.model_dump(mode="json", exclude_none=True)
    return derived_config(base, name, **changes)


def _server_run(options: BenchOptions, folder: Path) -> ScenarioResult:
    with opened(None, options) as session:
        return session.scenario(Scenario.SERVER, folder)


def _peak(folder: Path, outcome: PointOutcome, bound_s: float, settings: SloSettings) -> None:
    options = BenchOptions(
        model=folder.name,
        scenarios=[Scenario.SERVER],
        repo=folder.parent,
        duration_s=settings.run_seconds,
        find_peak=True,
        latency_bound_s=bound_s,
        min_query_count=settings.min_queries,
        max_peak_runs=settings.max_peak_runs,
        warmup_s=0.5,
    )
    scenario = _server_run(options, folder / "loadgen")
    outcome.status = "measured"
    outcome.peak_qps = scenario.peak_qps
    main: RunResult | None = scenario.main
    outcome.p99_ms = main.p99_s * 1e3 if main is not None and main.p99_s is not None else None
    outcome.sweep = [
        {
            "target_qps": r.settings.target_qps,
            "p99_ms": r.p99_s * 1e3 if r.p99_s is not None else None,
            "valid": r.valid,
        }
        for r in scenario.sweep
    ]
    if not scenario.peak_qps:
        outcome.reason = "no rate held the bound"


def _verify(
    repo: Path, model: str, bound_s: float, peak: float, settings: SloSettings, scratch: Path
) -> tuple[float | None, dict[str, Any]]:
    """Server runs against the repository as written, at share x peak, stepping down on a miss.

    Returns the highest verified rate (None if none held) and every attempt.
    """
    attempts = []
    rate = peak * settings.rate_share
    for n in range(settings.verify_attempts):
        options = BenchOptions(
            model=model,
            scenarios=[Scenario.SERVER],
            repo=repo,
            duration_s=settings.verify_seconds,
            target_qps=rate,
            latency_bound_s=bound_s,
            min_query_count=settings.min_queries,
            warmup_s=0.5,
        )
        run = _server_run(options, scratch / f"verify-{n}").main
        assert run is not None
        p99 = run.p99_s
        attempts.append(
            {
                "target_qps": rate,
                "throughput": run.throughput,
                "p99_ms": p99 * 1e3 if p99 is not None else None,
                "valid": run.valid,
                "reasons": run.reasons,
                "completed": run.completed,
            }
        )
        if run.valid:
            return rate, {**attempts[-1], "attempts": attempts}
        rate *= settings.step_down
    return None, {**attempts[-1], "attempts": attempts}
