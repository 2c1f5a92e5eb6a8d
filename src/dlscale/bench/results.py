"""What a benchmark produced: one LoadGen run, one scenario (with its sweep), the whole report."""

from __future__ import annotations

import datetime
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from dlscale.bench.accuracy import AccuracyResult
from dlscale.bench.latency import summarize
from dlscale.bench.scenarios import RunSettings, Scenario


@dataclass
class RunResult:
    """One LoadGen test: LoadGen's verdict and figures beside the bench's own timings."""

    target: str
    settings: RunSettings
    loadgen: dict[str, Any]
    latencies_ns: np.ndarray
    throughput: float | None
    issued: int
    completed: int
    errors: int
    first_errors: list[str]
    duration_s: float
    log_dir: Path
    accuracy: AccuracyResult | None = None
    #: Each request's time from sending to answer (the concurrency sweep's latency).
    request_ns: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))

    @property
    def scenario(self) -> Scenario:
        return self.settings.scenario

    @property
    def reasons(self) -> list[str]:
        """Why the run is not valid (empty when it is)."""
        out = list(self.loadgen.get("reasons", []))
        if self.loadgen.get("result") not in ("VALID", None) and not out:
            out.append(f"LoadGen result: {self.loadgen.get('result')}")
        if self.errors:
            out.append(f"{self.errors} samples failed (first: {self.first_errors[0]})")
        if self.accuracy is not None and self.accuracy.ok is False:
            out.append(
                f"accuracy: {self.accuracy.passed}/{self.accuracy.samples} samples passed "
                f"({self.accuracy.method})"
            )
        return out

    @property
    def valid(self) -> bool:
        """LoadGen says VALID, no request failed, and accuracy (when checked) holds."""
        return bool(self.loadgen.get("valid")) and not self.reasons

    @property
    def p99_s(self) -> float | None:
        """The bench's own p99 latency in seconds."""
        return summarize(self.latencies_ns).get("p99")

    def to_dict(self) -> dict[str, Any]:
        """As JSON values (latencies as percentiles, not raw)."""
        return {
            "target": self.target,
            "scenario": self.scenario.loadgen_name,
            "valid": self.valid,
            "verdict": "VALID" if self.valid else "INVALID",
            "reasons": self.reasons,
            "settings": self.settings.to_dict(),
            "throughput_samples_per_s": self.throughput,
            "latency_s": summarize(self.latencies_ns),
            "request_latency_s": summarize(self.request_ns),
            "loadgen": self.loadgen,
            "issued": self.issued,
            "completed": self.completed,
            "errors": {"count": self.errors, "first": self.first_errors},
            "duration_s": self.duration_s,
            "log_dir": str(self.log_dir),
            "accuracy": self.accuracy.to_dict() if self.accuracy else None,
        }


@dataclass
class ScenarioResult:
    """A scenario's headline run, with the sweep that found it (find-peak) when there was one."""

    scenario: Scenario
    main: RunResult | None
    sweep: list[RunResult] = field(default_factory=list)
    peak_qps: float | None = None
    note: str = ""
    #: What the sweep varied: "rate" (a peak search) or "concurrency"; "" without a sweep.
    sweep_kind: str = ""

    def to_dict(self) -> dict[str, Any]:
        """As JSON values."""
        return {
            "scenario": self.scenario.loadgen_name,
            "note": self.note,
            "peak_qps": self.peak_qps,
            "result": self.main.to_dict() if self.main else None,
            "sweep": [sweep_point(r, self.sweep_kind) for r in self.sweep],
        }


def out_dir(out: str | Path | None, name: str) -> Path:
    """The report's folder: --out, else bench-results/NAME-DATE-TIME."""
    if out:
        return Path(out)
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    return Path("bench-results") / f"{name}-{stamp}"


def sweep_point(run: RunResult, kind: str = "") -> dict[str, Any]:
    """One point of a sweep: offered rate or concurrency, achieved throughput, p99, verdict."""
    return {
        "target": run.target,
        "sweep": kind,
        "target_qps": run.settings.target_qps,
        "concurrency": run.settings.concurrency,
        "request_latency_s": summarize(run.request_ns),
        "throughput_samples_per_s": run.throughput,
        "p99_s": run.p99_s,
        "loadgen_p99_s": run.loadgen.get("latency_s", {}).get("p99"),
        "valid": run.valid,
        "reasons": run.reasons,
        "log_dir": str(run.log_dir),
    }
