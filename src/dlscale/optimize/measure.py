"""Speed of a staged variant, measured with MLPerf LoadGen through dlscale's in-process batcher."""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dlscale.bench.loadgen import LoopThread
from dlscale.bench.results import RunResult
from dlscale.bench.scenarios import Scenario
from dlscale.bench.session import BenchOptions, Session


@dataclass(frozen=True)
class Speed:
    """Offline throughput and SingleStream latency of one variant, with LoadGen's verdicts."""

    offline_sps: float
    singlestream_p90_ms: float | None
    offline_valid: bool
    singlestream_valid: bool | None
    log_dir: str

    def to_dict(self) -> dict[str, Any]:
        """JSON form for the report."""
        return dict(self.__dict__)


@dataclass(frozen=True)
class MeterSettings:
    """How long each LoadGen run lasts; short by default, for a search over many variants."""

    seconds: float = 2.0
    #: Queries at least per run (LoadGen's early-stopping estimate wants 64 for a VALID
    #: SingleStream run; a search ranks variants and can do with fewer).
    min_queries: int = 32
    warmup_s: float = 0.5
    singlestream: bool = True


def measure(repo: Path, model: str, log_dir: Path, settings: MeterSettings) -> Speed:
    """LoadGen Offline (and SingleStream) against `repo/model`, served in process."""
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
    loop = LoopThread()
    session = Session(None, options, loop)
    try:
        session.open()
        runs = [session.scenario(s, log_dir).main for s in scenarios]
    finally:
        session.close()
        loop.close()
    offline, single = runs[0], (runs[1] if len(runs) > 1 else None)
    assert offline is not None
    return Speed(
        offline_sps=float(offline.throughput or 0.0),
        singlestream_p90_ms=_p90_ms(single) if single is not None else None,
        offline_valid=offline.valid,
        singlestream_valid=single.valid if single is not None else None,
        log_dir=str(log_dir),
    )


def _p90_ms(run: RunResult) -> float | None:
    if not len(run.latencies_ns):
        return None
    ordered = sorted(int(v) for v in run.latencies_ns)
    return ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))] / 1e6


def median_speed(speeds: list[Speed]) -> Speed:
    """The median of repeated measurements of one variant (the first's logs are kept)."""
    tputs = [s.offline_sps for s in speeds]
    lats = [s.singlestream_p90_ms for s in speeds if s.singlestream_p90_ms is not None]
    first = speeds[0]
    return Speed(
        offline_sps=statistics.median(tputs),
        singlestream_p90_ms=statistics.median(lats) if lats else None,
        offline_valid=all(s.offline_valid for s in speeds),
        singlestream_valid=first.singlestream_valid,
        log_dir=first.log_dir,
    )
