"""Per-model counters and histograms: one record behind both the statistics API and Prometheus."""

from __future__ import annotations

import bisect
import time
from collections import defaultdict
from dataclasses import dataclass, field

from dlscale.types import BatchStats, InferStats, ModelStatistics, StatDuration

#: Request latency buckets in seconds: sub-millisecond to a few seconds.
LATENCY_BUCKETS_S = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
)  # fmt: skip
#: Batch size buckets: powers of two up to the largest batch a model is likely to take.
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)


@dataclass
class Histogram:
    """Cumulative histogram in the Prometheus sense (bucket counts, sum, count)."""

    bounds: tuple[float, ...]
    counts: list[int] = field(default_factory=list)
    total: float = 0.0
    count: int = 0

    def __post_init__(self) -> None:
        self.counts = [0] * (len(self.bounds) + 1)

    def observe(self, value: float, times: int = 1) -> None:
        """Count `value` (`times` times over: a gap shared by several tokens)."""
        self.counts[bisect.bisect_left(self.bounds, value)] += times
        self.total += value * times
        self.count += times

    def cumulative(self) -> list[tuple[str, int]]:
        """Prometheus' buckets: (upper bound as its `le` label, count at or below) pairs, ending
        with +Inf."""
        out, running = [], 0
        for bound, n in zip((*self.bounds, float("inf")), self.counts, strict=True):
            running += n
            out.append(("+Inf" if bound == float("inf") else repr(float(bound)), running))
        return out


@dataclass
class Duration:
    """A count and a total time in nanoseconds, as Triton's statistics report them."""

    count: int = 0
    ns: int = 0

    def add(self, ns: int, count: int = 1) -> None:
        self.count += count
        self.ns += ns

    def snapshot(self) -> StatDuration:
        """The count and time now, frozen."""
        return StatDuration(self.count, self.ns)


@dataclass(slots=True)  # one per request: slots make it cheaper to make and to fill
class RequestTimes:
    """One request's way through the server, in nanoseconds of perf_counter: Triton's trace
    timestamps, from which the statistics of a successful request are taken."""

    request_start: int = 0
    queue_start: int = 0
    compute_start: int = 0
    compute_input_end: int = 0
    compute_output_start: int = 0
    compute_end: int = 0
    request_end: int = 0
    #: Rows of the batch the request ran in (an OTLP span's attribute; not a timestamp).
    batch_rows: int = 0


@dataclass
class BatchDurations:
    """Executions of one batch size and where their time went (merge, compute, split)."""

    compute_input: Duration = field(default_factory=Duration)
    compute_infer: Duration = field(default_factory=Duration)
    compute_output: Duration = field(default_factory=Duration)


@dataclass
class ModelStats:
    """Everything measured about one model version since it was loaded.

    Counted as Triton's statistics extension defines them: success, fail, queue and compute_*
    count requests (a request's compute time is that of the batch it ran in); inference_count
    counts the rows of successful requests; execution_count and batch_stats count batches.
    """

    name: str
    version: str
    success: Duration = field(default_factory=Duration)
    fail: Duration = field(default_factory=Duration)
    queue: Duration = field(default_factory=Duration)
    compute_input: Duration = field(default_factory=Duration)
    compute_infer: Duration = field(default_factory=Duration)
    compute_output: Duration = field(default_factory=Duration)
    #: The response cache: lookups that answered (their time), and lookups that missed (with the
    #: time to insert the computed answer).
    cache_hit: Duration = field(default_factory=Duration)
    cache_miss: Duration = field(default_factory=Duration)
    failures: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    inference_count: int = 0  # rows of successful requests
    execution_count: int = 0  # batches run
    pending: int = 0  # requests queued or in a batch now
    last_inference_ms: int = 0
    latency: Histogram = field(default_factory=lambda: Histogram(LATENCY_BUCKETS_S))
    batch_size: Histogram = field(default_factory=lambda: Histogram(BATCH_BUCKETS))
    batch_stats: dict[int, BatchDurations] = field(
        default_factory=lambda: defaultdict(BatchDurations)
    )

    def record_success(self, times: RequestTimes, rows: int) -> None:
        """A request answered: its time in the server, in the queue and in its batch."""
        total = times.request_end - times.request_start
        # Written out rather than five `Duration.add` calls: this runs once per request.
        success, queue = self.success, self.queue
        success.count += 1
        success.ns += total
        queue.count += 1
        queue.ns += times.compute_start - times.queue_start
        merge, infer, split = self.compute_input, self.compute_infer, self.compute_output
        merge.count += 1
        merge.ns += times.compute_input_end - times.compute_start
        infer.count += 1
        infer.ns += times.compute_output_start - times.compute_input_end
        split.count += 1
        split.ns += times.compute_end - times.compute_output_start
        self.inference_count += rows
        self.latency.observe(total / 1e9)

    def record_cache_hit(self, total_ns: int, lookup_ns: int, rows: int) -> None:
        """A request answered from the response cache: a success that ran no batch."""
        self.success.add(total_ns)
        self.cache_hit.add(lookup_ns)
        self.inference_count += rows
        self.latency.observe(total_ns / 1e9)

    def record_failure(self, reason: str, total_ns: int) -> None:
        """A request that failed, with Triton's reason label (REJECTED, BACKEND, ...)."""
        self.fail.add(total_ns)
        self.failures[reason] += 1

    def record_batch(self, rows: int, input_ns: int, infer_ns: int, output_ns: int) -> None:
        """One batch executed: its rows and where its time went (merge, compute, split)."""
        self.execution_count += 1
        self.batch_size.observe(rows)
        durations = self.batch_stats[rows]
        durations.compute_input.add(input_ns)
        durations.compute_infer.add(infer_ns)
        durations.compute_output.add(output_ns)
        self.last_inference_ms = int(time.time() * 1000)

    def snapshot(self) -> ModelStatistics:
        """What the statistics extension reports for this model version now."""
        return ModelStatistics(
            name=self.name,
            version=self.version,
            last_inference_ms=self.last_inference_ms,
            inference_count=self.inference_count,
            execution_count=self.execution_count,
            inference_stats=InferStats(
                success=self.success.snapshot(),
                fail=self.fail.snapshot(),
                queue=self.queue.snapshot(),
                compute_input=self.compute_input.snapshot(),
                compute_infer=self.compute_infer.snapshot(),
                compute_output=self.compute_output.snapshot(),
                cache_hit=self.cache_hit.snapshot(),
                cache_miss=self.cache_miss.snapshot(),
            ),
            batch_stats=tuple(
                BatchStats(
                    size,
                    d.compute_input.snapshot(),
                    d.compute_infer.snapshot(),
                    d.compute_output.snapshot(),
                )
                for size, d in sorted(self.batch_stats.items())
            ),
        )
