"""The four MLPerf scenarios and the LoadGen settings a run uses for each."""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass
from typing import Any

import mlperf_loadgen as lg

from dlscale.errors import BenchError


class Scenario(enum.StrEnum):
    """An MLPerf LoadGen scenario, by its command-line name."""

    SINGLESTREAM = "singlestream"
    MULTISTREAM = "multistream"
    SERVER = "server"
    OFFLINE = "offline"

    @property
    def loadgen_name(self) -> str:
        """LoadGen's own spelling (SingleStream, ...), as its logs write it."""
        return _TITLES[self]

    @classmethod
    def parse(cls, name: str) -> list[Scenario]:
        """One scenario by name, or all four for `all`."""
        if name.lower() == "all":
            return list(cls)
        try:
            return [cls(name.lower())]
        except ValueError:
            choices = ", ".join([*(s.value for s in cls), "all"])
            raise BenchError(f"unknown scenario {name!r}: expected one of {choices}") from None


_TITLES = {
    Scenario.SINGLESTREAM: "SingleStream",
    Scenario.MULTISTREAM: "MultiStream",
    Scenario.SERVER: "Server",
    Scenario.OFFLINE: "Offline",
}

#: MLPerf Inference server-scenario p99 bounds (shared/reference/mlperf.md), by zoo name.
MLPERF_LATENCY_BOUNDS_S = {
    "resnet50": 0.015,
    "retinanet": 0.100,
    "bert-base": 0.130,
    "bert": 0.130,
    "dlrm": 0.060,
    "rnnt": 1.0,
}
#: The names LoadGen's embedded mlperf.conf knows these models by (for --official).
MLPERF_MODEL_KEYS = {"resnet50": "resnet50", "bert-base": "bert-99", "bert": "bert-99"}
#: Bound used when neither MLPerf nor the user gives one.
DEFAULT_LATENCY_BOUND_S = 0.100


@dataclass(frozen=True)
class RunSettings:
    """Everything that shapes one LoadGen run; written to the report as it is."""

    scenario: Scenario
    duration_s: float = 10.0
    #: Queries at least (SingleStream, MultiStream, Server) or samples (Offline).
    min_query_count: int = 64
    #: Server scenario: Poisson arrival rate in queries per second.
    target_qps: float | None = None
    #: p99 bound for the Server scenario (and the check for the others).
    latency_bound_s: float = DEFAULT_LATENCY_BOUND_S
    official: bool = False
    accuracy: bool = False
    #: Samples in one MultiStream query (MLPerf: 8).
    samples_per_query: int = 8
    #: From the warm-up probe: what LoadGen should expect, so it generates enough queries.
    expected_latency_s: float | None = None
    expected_qps: float | None = None
    #: Offline: rows per request and requests in flight (remote targets).
    batch_size: int = 1
    concurrency: int = 0
    seed: int = 0
    model_key: str = ""

    def to_dict(self) -> dict[str, Any]:
        """The settings as JSON values."""
        out: dict[str, Any] = {k: v for k, v in self.__dict__.items() if k != "scenario"}
        out["scenario"] = self.scenario.loadgen_name
        return out

    def minimums_s(self) -> float:
        """How long the minimums take when the system keeps up: the duration, or the minimum
        query count at the offered rate (Server) or one query after another (Single- and
        MultiStream), whichever is longer. A net under it would end every run INVALID (a
        Server run at 4.7 queries/s needs 109 s for 512 queries)."""
        if self.scenario is Scenario.SERVER and self.target_qps:
            pace = 1 / self.target_qps
        elif self.scenario in (Scenario.SINGLESTREAM, Scenario.MULTISTREAM):
            pace = self.expected_latency_s or 0.0
        else:  # Offline: one query
            pace = 0.0
        return max(self.duration_s, self.min_query_count * pace)

    def to_loadgen(self, sample_count: int) -> Any:
        """The `mlperf_loadgen.TestSettings` for this run."""
        s = lg.TestSettings()
        s.scenario = getattr(lg.TestScenario, self.scenario.loadgen_name)
        if self.official:
            # The MLPerf minimums (600 s, query counts) from LoadGen's embedded mlperf.conf.
            s.FromConfig("", self.model_key or "*", self.scenario.loadgen_name, 0)
        else:
            s.min_duration_ms = int(self.duration_s * 1000)
            s.min_query_count = self.min_query_count
            # A safety net only: LoadGen stops at the minimums when the system keeps up.
            needed = self.minimums_s()
            s.max_duration_ms = int(max(self.duration_s * 4, needed + 30) * 1000)
        s.mode = lg.TestMode.AccuracyOnly if self.accuracy else lg.TestMode.PerformanceOnly
        bound_ns = int(self.latency_bound_s * 1e9)
        s.server_target_latency_ns = bound_ns
        s.server_target_latency_percentile = 0.99
        s.multi_stream_samples_per_query = self.samples_per_query
        if self.scenario is Scenario.SERVER:
            if not self.target_qps or self.target_qps <= 0:
                raise BenchError("the server scenario needs --target-qps Q (> 0) or --find-peak")
            s.server_target_qps = float(self.target_qps)
        latency = self.expected_latency_s or 0.001
        # Queries are generated up front from the expected latency: under-estimate it so a
        # faster system never runs out of queries before the minimum duration.
        s.single_stream_expected_latency_ns = max(1000, int(latency * 1e9 / 2))
        s.multi_stream_expected_latency_ns = s.single_stream_expected_latency_ns
        qps = self.expected_qps or 1000.0
        # Offline sends one query sized from the expected rate; over-size it so that the
        # query lasts the minimum duration.
        s.offline_expected_qps = float(qps * 1.5)
        s.performance_sample_count_override = sample_count
        s.sample_index_rng_seed = self.seed
        s.schedule_rng_seed = self.seed
        s.qsl_rng_seed = self.seed
        return s


def latency_bound_for(model: str, given_s: float | None) -> tuple[float, str]:
    """The p99 bound to hold and where it comes from: the user's, MLPerf's, or the default."""
    if given_s is not None:
        if given_s <= 0:
            raise BenchError(f"--latency-bound must be positive, got {given_s}s")
        return given_s, "--latency-bound"
    if model in MLPERF_LATENCY_BOUNDS_S:
        return MLPERF_LATENCY_BOUNDS_S[model], "MLPerf server bound"
    return DEFAULT_LATENCY_BOUND_S, "default"


def parse_duration(text: str) -> float:
    """Seconds from `15ms`, `250us`, `10s`, `2m` or a bare number of seconds."""
    value = text.strip().lower()
    units = {"ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9, "s": 1.0, "m": 60.0}
    suffix = next((u for u in units if value.endswith(u)), "")
    number, scale = (value[: -len(suffix)], units[suffix]) if suffix else (value, 1.0)
    try:
        seconds = float(number) * scale
    except ValueError:
        raise BenchError(f"{text!r} is not a duration (examples: 15ms, 10s, 2m)") from None
    if not math.isfinite(seconds) or seconds <= 0:
        raise BenchError(f"{text!r}: a duration must be positive")
    return seconds
