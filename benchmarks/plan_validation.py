"""Validate `plan serve`: the queueing model's peak rate against a measured LoadGen Server peak.

    python -m benchmarks.plan_validation [--model resnet50] [--bound 1s | 50x] [--repeats 3]

On this machine, for one model served as its config.toml says (max batch, queue delay, adaptive
delay, instances), each repetition:

1. times the backend alone (same session options as the server) at batch 1, 2, 4, ... until a
   batch takes twice the bound or reaches the max batch size: the service-time profile;
2. asks the planner (`plan.queueing.peak_rate`) for the highest Poisson rate whose p99 holds
   the bound, given that profile and the served settings;
3. measures the peak with LoadGen's Server scenario (Poisson arrivals) through dlscale's batcher
   in process, with find-peak; a rate holds when LoadGen's own p99 is within the bound;
then times the profile again (the machine is shared: each prediction uses the mean of the
profiles taken just before and just after its measurement). The tables give medians.
Results go to bench-results/plan-validation-*/result.json. docs/plan.md explains the comparison.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.harness.servers import RESULTS
from dlscale.bench import environment
from dlscale.bench.peak import find_peak
from dlscale.bench.results import RunResult
from dlscale.bench.scenarios import Scenario, parse_duration
from dlscale.bench.session import BenchOptions, opened
from dlscale.errors import BenchError
from dlscale.models.config import ModelConfig
from dlscale.models.locate import onnx_file
from dlscale.models.repository import ModelRepository, ModelVersion
from dlscale.models.runner import load_for_run, time_backend
from dlscale.models.samples import inputs_for
from dlscale.models.signature import reconcile
from dlscale.plan.queueing import BatchingServer, batching_policy, peak_rate
from dlscale.plan.serve import Profile

#: Every batch is timed at least this long (and three times) after one warm-up run.
PROFILE_SECONDS = 1.0


@dataclass(frozen=True)
class Served:
    """The batching settings the server runs a model with, read from its config.toml."""

    max_batch: int
    max_delay_s: float
    adaptive_delay: bool
    instances: int

    @classmethod
    def of(cls, config: ModelConfig) -> Served:
        """The settings of a config; instances on the CPU share one device."""
        batching = config.batching
        return cls(
            max(1, config.max_batch_size),
            batching.max_queue_delay_us / 1e6,
            batching.adaptive_queue_delay,
            sum(g.count for g in config.instances),
        )


#: Seconds of every timed run, per batch size.
Samples = dict[int, tuple[float, ...]]


@dataclass(frozen=True)
class Bound:
    """The p99 bound: seconds, or a multiple of the batch-1 service time profiled first.

    A multiple (`--bound 50x`) moves with the machine's speed: on a loaded machine the model
    and the host both slow down, and a bound in seconds that a quiet machine holds at half
    its peak may hold at no rate at all (the test on a shared machine uses it).
    """

    seconds: float | None = None
    services: float | None = None

    @classmethod
    def parse(cls, text: str) -> Bound:
        """`1s`, `250ms`, ... (parse_duration), or `50x`."""
        if not text.strip().lower().endswith("x"):
            return cls(seconds=parse_duration(text))
        try:
            services = float(text.strip()[:-1])
        except ValueError:
            services = math.nan
        if not (math.isfinite(services) and services > 0):
            raise BenchError(f"{text!r}: a multiple of the service time must be positive (50x)")
        return cls(services=services)

    def resolve(self, first: Samples) -> float:
        """The bound in seconds, given the first profile."""
        if self.seconds is not None:
            return self.seconds
        assert self.services is not None
        return self.services * statistics.fmean(first[1])


def measure_profile(
    version: ModelVersion, bound_s: float, min_seconds: float = PROFILE_SECONDS
) -> Samples:
    """Seconds per run of the backend alone at batch 1, 2, 4, ... (see the module's doc)."""
    backend = load_for_run(version)
    limit = max(1, version.config.max_batch_size)
    table: Samples = {}
    try:
        specs, _ = reconcile(
            version.config, backend.inputs, backend.outputs, version.path.parent / "config.toml"
        )
        rng = np.random.default_rng(0)
        batch = 1
        while True:
            inputs = inputs_for(version.name, version.path, specs, batch, rng)
            timing = time_backend(backend, inputs, min_seconds=min_seconds)
            table[batch] = timing.seconds
            if batch >= limit or statistics.fmean(timing.seconds) > 2 * bound_s:
                return table
            batch = min(2 * batch, limit)
    finally:
        backend.unload()


def predict(
    table: dict[int, float], served: Served, bound_s: float, spread: tuple[float, ...] = ()
) -> float:
    """The planner's peak rate for the served settings, a measured profile and its spread.

    The simulation caps batches at the largest size profiled, which takes more than twice the
    bound (or is the max batch size): a batch that large cannot meet the bound, so it forms
    only past the peak.
    """
    profile = Profile("model", "here", "fp32", table)
    largest = min(served.max_batch, max(table))
    server = BatchingServer(
        profile.time,
        batching_policy(largest, served.max_delay_s, served.adaptive_delay),
        instances_per_device=served.instances,
        service_spread=spread,
    )
    return peak_rate(server, bound_s)


def spread_of(table: dict[int, float], *profiles: Samples) -> tuple[float, ...]:
    """Every timed run over the mean of its batch size: how much service times vary here."""
    return tuple(t / table[b] for p in profiles for b in table for t in p[b])


@dataclass(frozen=True)
class Search:
    """How each peak is searched: LoadGen queries per run, runs at most, which verdict counts."""

    queries: int = 150
    max_runs: int = 6
    strict: bool = False
    #: A short run past the peak ends before its queue has grown to the bound (the queue starts
    #: empty): every run lasts at least this long, whatever the rate.
    min_duration_s: float = 60.0


@dataclass
class MeasuredPeak:
    """A find-peak search: the peak, every tried rate, and service times seen during it."""

    peak_qps: float | None
    runs: list[dict[str, Any]]
    in_run_profile: dict[str, float]
    seconds: float
    notes: list[str] = field(default_factory=list)


def holds(run: RunResult, bound_s: float, strict: bool) -> bool:
    """Whether a Server run held the bound: LoadGen's p99 within it (VALID too, when strict).

    Strict adds LoadGen's early stopping, a 99%-confidence margin that needs ~460 queries
    with none over the bound; the planner predicts where the p99 itself meets the bound.
    """
    if strict:
        return run.valid
    others = [r for r in run.reasons if not r.startswith("Early stopping")]
    p99 = run.loadgen.get("latency_s", {}).get("p99")
    return not others and p99 is not None and p99 <= bound_s


def measure_peak(
    repo: Path,
    model: str,
    bound_s: float,
    out_dir: Path,
    search: Search = Search(),
    seed: int = 0,
    warmup_s: float = 2.0,
) -> MeasuredPeak:
    """Find-peak with LoadGen's Server scenario against the model in process (dlscale's batcher)."""
    options = BenchOptions(
        model,
        [Scenario.SERVER],
        repo=repo,
        latency_bound_s=bound_s,
        min_query_count=search.queries,
        concurrency=2,  # the warm-up's throughput probe: two requests in flight suffice
        warmup_s=warmup_s,
        seed=seed,
        sample_count=64,
    )
    runs: list[dict[str, Any]] = []
    started = time.perf_counter()
    with opened(None, options) as session:
        assert session.warmup is not None
        start = max(1.0, session.warmup.throughput / 2)  # as `dlscale bench --find-peak` does
        before = session.loop.run(session.target.batch_times())

        def run_at(qps: float) -> tuple[bool, RunResult]:
            # LoadGen stops at the minimum duration once it has the queries, and gives up at
            # 4x: a minimum just under the time the queries take at this rate fits both.
            options.duration_s = max(search.min_duration_s, 0.9 * search.queries / qps)
            settings = session.settings(Scenario.SERVER, qps)
            result = session.run(settings, out_dir / f"seed{seed}" / f"qps-{qps:.2f}")
            passed = holds(result, bound_s, search.strict)
            runs.append(_point(result, passed))
            print(f"  {qps:8.2f}/s  p99 {runs[-1]['p99_s']}  {'holds' if passed else 'misses'}")
            return passed, result

        # A floor far below the start: a slow model on a busy machine may peak under 1/s.
        found = find_peak(run_at, start, max_runs=search.max_runs, floor_qps=start / 32)
        after = session.loop.run(session.target.batch_times())
    seen = environment.profile(model, None, "fp32", before, after) or {}
    notes = [f"search started at {start:.2f}/s (half the warm-up throughput)"]
    return MeasuredPeak(
        found.peak_qps, runs, seen.get("batch_latency_s", {}), time.perf_counter() - started, notes
    )


def _point(run: RunResult, passed: bool) -> dict[str, Any]:
    lat = run.loadgen.get("latency_s", {})
    return {
        "target_qps": run.settings.target_qps,
        "p99_s": lat.get("p99"),
        "p50_s": lat.get("p50"),
        "queries": run.completed,
        "throughput": run.throughput,
        "holds": passed,
        "loadgen_valid": run.valid,
        "reasons": run.reasons,
    }


def mean_table(*profiles: Samples) -> dict[int, float]:
    """Per batch size, the mean seconds over the profiles' runs (sizes every profile has)."""
    sizes = set.intersection(*(set(p) for p in profiles))
    return {b: statistics.fmean([t for p in profiles for t in p[b]]) for b in sorted(sizes)}


def validate(
    repo: Path,
    model: str,
    bound: Bound,
    repeats: int,
    out_dir: Path,
    search: Search = Search(),
    profile_seconds: float = PROFILE_SECONDS,
) -> dict[str, Any]:
    """Profile, peak, profile, ... `repeats` times; each prediction beside its measurement."""
    version = ModelRepository(repo).version(model)
    served = Served.of(version.config)
    rows: list[dict[str, Any]] = []
    # A bound in service times is known once the first profile is: that one runs to the max
    # batch size (its stop at twice the bound waits for the bound).
    first_bound = math.inf if bound.seconds is None else bound.seconds
    profiles = [measure_profile(version, first_bound, profile_seconds)]
    bound_s = bound.resolve(profiles[0])
    print(f"profile: {_ms(mean_table(profiles[-1]))}", flush=True)
    for r in range(repeats):
        peak = measure_peak(repo, model, bound_s, out_dir, search, seed=r)
        profiles.append(measure_profile(version, bound_s, profile_seconds))
        print(f"profile: {_ms(mean_table(profiles[-1]))}", flush=True)
        row = {
            "repeat": r + 1,
            "measured_qps": peak.peak_qps,
            "profile_runs_s": [{str(k): v for k, v in p.items()} for p in profiles[-2:]],
            "peak": asdict(peak),
        }
        rows.append({**row, **predictions(row, served, bound_s)})
        shown = {k: rows[-1][k] for k in ("measured_qps", "error", *_PREDICTIONS)}
        print(f"repeat {r + 1}: {json.dumps(shown)}", flush=True)
    return {
        "model": model,
        "bound_s": bound_s,
        "bound_services": bound.services,
        "served": asdict(served),
        "search": asdict(search),
        "profile": "backend timed alone (models.runner.time_backend), mean per batch size",
        "rows": rows,
    }


def predictions(row: dict[str, Any], served: Served, bound_s: float) -> dict[str, Any]:
    """The planner's answers for one repetition's measurements, and the error of the first."""
    before, after = ({int(b): tuple(t) for b, t in p.items()} for p in row["profile_runs_s"])
    table = mean_table(before, after)
    spread = spread_of(table, before, after)
    predicted = predict(table, served, bound_s, spread)
    seen = {int(b): t for b, t in row["peak"]["in_run_profile"].items()}
    measured = row["measured_qps"]
    return {
        "predicted_qps": predicted,
        "error": (predicted - measured) / measured if measured else None,
        # Every batch of a size taking exactly its mean (the model before the spread):
        "predicted_constant_service_qps": predict(table, served, bound_s),
        # The same model fed the mean service times the batcher saw during the search: what
        # is left of the error is the queueing model's, not the machine's drift. Its largest
        # size is the largest batch that formed, the search having gone past the peak.
        "predicted_in_run_qps": predict(seen, served, bound_s, spread) if 1 in seen else None,
        "profile_s": {str(k): v for k, v in table.items()},
    }


_PREDICTIONS = ("predicted_qps", "predicted_constant_service_qps", "predicted_in_run_qps")


def summary(result: dict[str, Any]) -> dict[str, Any]:
    """Medians over the repetitions, and the error of the median prediction."""
    rows = result["rows"]
    measured = [r["measured_qps"] for r in rows if r["measured_qps"]]
    predicted = [r["predicted_qps"] for r in rows]
    in_run = [r["predicted_in_run_qps"] for r in rows if r["predicted_in_run_qps"]]
    constant = [r["predicted_constant_service_qps"] for r in rows]
    errors = [r["error"] for r in rows if r["error"] is not None]
    out: dict[str, Any] = {
        "predicted_qps": statistics.median(predicted) if predicted else None,
        "measured_qps": statistics.median(measured) if measured else None,
        "predicted_in_run_qps": statistics.median(in_run) if in_run else None,
        "predicted_constant_service_qps": statistics.median(constant) if constant else None,
        "median_error": statistics.median(errors) if errors else None,
        "errors": errors,
    }
    if out["predicted_qps"] and out["measured_qps"]:
        out["error_of_medians"] = out["predicted_qps"] / out["measured_qps"] - 1
    return out


def _ms(table: dict[int, float]) -> str:
    return ", ".join(f"b{k} {v * 1e3:.0f} ms" for k, v in table.items())


def main(argv: list[str] | None = None) -> int:
    """Entry point (also run by `make bench` through benchmarks/run.py)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="resnet50", help="a zoo model (built once)")
    parser.add_argument("--repo", type=Path, help="a repository holding --model instead")
    parser.add_argument(
        "--bound",
        default="1s",
        help="p99 latency bound (default 1s), or a multiple of batch 1's profiled time (50x)",
    )
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--queries", type=int, default=150, help="LoadGen queries per run")
    parser.add_argument("--max-runs", type=int, default=6, help="LoadGen runs per peak search")
    parser.add_argument("--min-duration", default="60s", help="each LoadGen run at least this")
    parser.add_argument("--strict", action="store_true", help="LoadGen VALID (early stopping)")
    parser.add_argument("--profile-seconds", type=float, default=PROFILE_SECONDS)
    parser.add_argument("--out", type=Path, help="results folder (default bench-results/...)")
    parser.add_argument(
        "--from", dest="again", type=Path, help="predict again from a result.json's measurements"
    )
    args = parser.parse_args(argv)
    if args.again:
        result = json.loads(args.again.read_text())
        served = Served(**result["served"])
        for row in result["rows"]:
            row.update(predictions(row, served, result["bound_s"]))
        result["summary"] = summary(result)
        if args.out:  # the whole result, predictions redone, beside the one it was made from
            args.out.mkdir(parents=True, exist_ok=True)
            (args.out / "result.json").write_text(json.dumps(result, indent=1))
        print(json.dumps(result["summary"], indent=1))
        return 0
    repo = args.repo or onnx_file(args.model).parents[2]
    bound = Bound.parse(args.bound)
    out = args.out or RESULTS / f"plan-validation-{time.strftime('%Y%m%d-%H%M%S')}"
    result = validate(
        repo,
        args.model,
        bound,
        args.repeats,
        out / "loadgen",
        Search(args.queries, args.max_runs, args.strict, parse_duration(args.min_duration)),
        args.profile_seconds,
    )
    result["summary"] = summary(result)
    result["command"] = " ".join(["python -m benchmarks.plan_validation", *(argv or sys.argv[1:])])
    result["machine"] = {"host": environment.host(), "date": environment.now()}
    out.mkdir(parents=True, exist_ok=True)
    (out / "result.json").write_text(json.dumps(result, indent=1))
    print(json.dumps(result["summary"], indent=1))
    print(f"results: {out / 'result.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
