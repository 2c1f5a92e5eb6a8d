"""Speed of a staged variant, measured with MLPerf LoadGen through dlscale's in-process batcher."""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dlscale.bench.results import RunResult
from dlscale.bench.scenarios import Scenario
from dlscale.bench.session import BenchOptions, opened


@dataclass(frozen=True)
class Speed:
    """Offline throughput (the median of repeated runs) and SingleStream latency of one
    variant, with LoadGen's verdicts."""

    offline_sps: float
    singlestream_p90_ms: float | None
    offline_valid: bool
    singlestream_valid: bool | None
    log_dir: str
    #: Each Offline run's samples/s; the median is offline_sps.
    offline_runs: tuple[float, ...] = ()

    @property
    def spread(self) -> float:
        """(fastest - slowest run) / median: how much the runs disagree (0 for one run)."""
        runs = self.offline_runs
        if len(runs) < 2 or not self.offline_sps:
            return 0.0
        return (max(runs) - min(runs)) / self.offline_sps

    def to_dict(self) -> dict[str, Any]:
        """JSON form for the report."""
        return {**self.__dict__, "offline_runs": list(self.offline_runs), "spread": self.spread}


@dataclass(frozen=True)
class MeterSettings:
    """How long each LoadGen run lasts; short by default, for a search over many variants."""

    seconds: float = 2.0
    #: Queries at least per run (LoadGen's early-stopping estimate wants 64 for a VALID
    #: SingleStream run; a search ranks variants and can do with fewer).
    min_queries: int = 32
    warmup_s: float = 0.5
    singlestream: bool = True
    #: Offline runs per variant: the decision takes their median and shows their spread.
    repeats: int = 3


def measure(repo: Path, model: str, log_dir: Path, settings: MeterSettings) -> Speed:
    """LoadGen Offline `repeats` times (and SingleStream once) against `repo/model`, in process."""
    scenarios = [Scenario.OFFLINE] + ([Scenario.SINGLESTREAM] if settings.singlestream else [])
    options = BenchOptions(
        model=model,
        scenarios=scenarios,
        repo=repo,
        duration_s=settings.seconds,
        min_query_count=settings.min_queries,
        warmup_s=settings.warmup_s,
    )
    options.check()
    with opened(None, options) as session:
        offline = [
            session.scenario(Scenario.OFFLINE, log_dir / f"run{n + 1}").main
            for n in range(max(1, settings.repeats))
        ]
        single = None
        if settings.singlestream:
            single = session.scenario(Scenario.SINGLESTREAM, log_dir).main
    assert all(run is not None for run in offline)
    rates = tuple(float(run.throughput or 0.0) for run in offline if run is not None)
    return Speed(
        offline_sps=statistics.median(rates),
        singlestream_p90_ms=_p90_ms(single) if single is not None else None,
        offline_valid=all(run.valid for run in offline if run is not None),
        singlestream_valid=single.valid if single is not None else None,
        log_dir=str(log_dir),
        offline_runs=rates,
    )


def _p90_ms(run: RunResult) -> float | None:
    if not len(run.latencies_ns):
        return None
    ordered = sorted(int(v) for v in run.latencies_ns)
    return ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))] / 1e6
