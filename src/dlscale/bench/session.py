"""A bench session: one open target, its samples and warm-up, running scenarios on LoadGen."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from dlscale.bench import accuracy
from dlscale.bench.data import SampleSet, load_samples
from dlscale.bench.lglog import read_logs
from dlscale.bench.loadgen import LoopThread, Recorder, SystemUnderTest, run_loadgen
from dlscale.bench.peak import find_peak
from dlscale.bench.probe import DEFAULT_RATE_RULE, Probe, default_server_rate, probe
from dlscale.bench.progress import Progress, Steps
from dlscale.bench.results import RunResult, ScenarioResult
from dlscale.bench.scenarios import MLPERF_MODEL_KEYS, RunSettings, Scenario, latency_bound_for
from dlscale.bench.shared_memory import KINDS as SHM_KINDS
from dlscale.bench.targets import (
    InProcessTarget,
    ModelInfo,
    RemoteTarget,
    Target,
    local_signature,
)
from dlscale.bench.workers import PoolSut, WorkerPool, WorkerSpec
from dlscale.errors import BenchError, DlscaleError
from dlscale.models.repository import ModelRepository

#: MLPerf's minimum queries for its early-stopping estimate to hold at these percentiles.
EARLY_STOPPING_QUERIES = {
    Scenario.SINGLESTREAM: 64,
    Scenario.MULTISTREAM: 662,
    Scenario.SERVER: 512,
    Scenario.OFFLINE: 1,
}
#: How many times a run that ended before LoadGen's minimum duration is rerun, sized up.
SIZING_RERUNS = 3


@dataclass
class BenchOptions:
    """What the user asked for (the command line's flags, typed)."""

    model: str
    scenarios: list[Scenario]
    repo: Path | None = None
    version: str = ""
    duration_s: float = 10.0
    target_qps: float | None = None
    find_peak: bool = False
    latency_bound_s: float | None = None
    official: bool = False
    accuracy: bool = False
    data: Path | None = None
    reference: Path | None = None
    batch_size: int | None = None
    concurrency: int | None = None
    connections: int = 64
    sample_count: int = 256
    min_query_count: int | None = None
    progress: bool = False
    seed: int = 0
    max_peak_runs: int = 10
    warmup_s: float = 1.0
    #: none, system or cuda: tensors through shared-memory regions (perf_analyzer's option).
    shared_memory: str = "none"
    #: Bytes of output region per output and request; None: from the output's shape.
    output_shm_size: int | None = None
    #: A fleet's metrics page: each replica's share of the run is reported (bench/fleet_load.py).
    fleet_metrics: str | None = None
    #: Worker processes that send, receive and check requests (0: the bench's own loop).
    workers: int = 0
    #: Measure the client's ceiling against a null server first (remote targets).
    client_ceiling: bool = True
    #: Offline runs at each of these concurrencies (a throughput-latency curve); () for none.
    concurrency_sweep: tuple[int, ...] = ()

    def check(self) -> None:
        """Refuse contradictory settings before anything is loaded."""
        if self.find_peak and self.target_qps:
            raise BenchError("give either --target-qps or --find-peak, not both")
        if self.target_qps is not None and self.target_qps <= 0:
            raise BenchError(f"--target-qps must be positive, got {self.target_qps}")
        if self.duration_s <= 0:
            raise BenchError("--duration must be positive")
        if self.shared_memory not in SHM_KINDS:
            raise BenchError(
                f"--shared-memory {self.shared_memory!r}: expected one of {', '.join(SHM_KINDS)}"
            )
        if self.output_shm_size is not None and self.output_shm_size < 1:
            raise BenchError(f"--output-shm-size must be positive, got {self.output_shm_size}")
        if self.workers < 0:
            raise BenchError(f"--workers must be 0 or more, got {self.workers}")
        if any(c < 1 for c in self.concurrency_sweep):
            raise BenchError(
                f"--concurrency: every value must be at least 1: {self.concurrency_sweep}"
            )
        for name, flag in _AT_LEAST_ONE.items():
            value = getattr(self, name)
            if value is not None and value < 1:
                raise BenchError(f"{flag} must be at least 1, got {value}")
        # Read only with --accuracy or a roofline: a mistyped one went unnoticed otherwise.
        # Checked here, not as the flag is parsed: the docs' commands parse without the files.
        if self.reference is not None and not self.reference.is_file():
            why = "not a file" if self.reference.exists() else "no such file"
            raise BenchError(f"--reference {self.reference}: {why}")


#: The counts that must be at least 1, by field, and the flag that sets each.
_AT_LEAST_ONE = {
    "batch_size": "--batch-size",
    "concurrency": "--concurrency",
    "min_query_count": "--min-queries",
    "sample_count": "--samples",
    "connections": "--connections",
}


class Session:
    """A target opened on the bench's loop, with samples, warm-up figures and references."""

    def __init__(
        self,
        url: str | None,
        options: BenchOptions,
        loop: LoopThread,
        target: Target | None = None,
    ) -> None:
        self.options = options
        self.loop = loop
        self.target: Target = target or _open_target(url, options)
        self.info: ModelInfo | None = None
        self.samples: SampleSet | None = None
        self.warmup: Probe | None = None
        #: The long steps said on stderr as they begin (with --progress).
        self.steps = Steps(options.progress)
        self.bound_s, self.bound_source = latency_bound_for(options.model, options.latency_bound_s)
        self._reference: list[dict[str, np.ndarray]] | None = None
        self._reference_source = ""
        self.url = url
        self.pool: WorkerPool | None = None
        if options.workers and not isinstance(self.target, RemoteTarget):
            raise BenchError(
                "--workers sends requests from worker processes to a server: give a target URL"
            )

    @property
    def label(self) -> str:
        return self.target.label

    def open(self) -> None:
        """Connect or load, read the model, make samples, warm up."""
        opts = self.options
        if isinstance(self.target, RemoteTarget):
            self.target.declared = local_signature(self.model_file(), opts.data)
        self.steps(f"{self.label}: opening {opts.model} (connect or load)")
        self.info = self.loop.run(self.target.open())
        self.samples = load_samples(self.info, opts.data, opts.sample_count, opts.seed)
        if opts.accuracy:
            self.steps("reference outputs for the accuracy check")
            self._prepare_reference()
        batch, concurrency = self.offline_shape()
        self.steps(f"warm-up: {opts.warmup_s:g} s at batch {batch}, concurrency {concurrency}")
        self.warmup = self.loop.run(
            probe(self.target, self.info, self.samples, batch, concurrency, opts.warmup_s)
        )
        if opts.workers:
            self.steps(f"starting {opts.workers} worker processes")
            self.pool = WorkerPool(self._worker_spec(), opts.workers)

    def _worker_spec(self) -> WorkerSpec:
        opts, target = self.options, _open_target(self.url, self.options)
        assert isinstance(target, RemoteTarget) and isinstance(self.target, RemoteTarget)
        assert self.info is not None
        target.declared = self.target.declared
        return WorkerSpec(target, self.info, opts.data, opts.sample_count, opts.seed)

    def close(self) -> None:
        """Stop the workers, close the target (errors on the way out are not the result's)."""
        if self.pool is not None:
            self.pool.close()
            self.pool = None
        with contextlib.suppress(Exception):
            self.loop.run(self.target.close())

    def model_file(self) -> Path | None:
        """The FP32 model file the bench can read: --reference, the repo's, or None."""
        if self.options.reference is not None:
            return self.options.reference
        if self.info is not None and self.info.model_file is not None:
            return self.info.model_file
        if self.options.repo is not None:
            with contextlib.suppress(DlscaleError):
                return ModelRepository(self.options.repo).version(self.options.model).model_file
        return None

    # -- settings --------------------------------------------------------------------------------

    def settings(self, scenario: Scenario, target_qps: float | None = None) -> RunSettings:
        """The run settings for a scenario, filled from the options and the warm-up."""
        opts = self.options
        assert self.warmup is not None and self.info is not None
        batch, concurrency = self.offline_shape()
        return RunSettings(
            scenario=scenario,
            duration_s=opts.duration_s,
            min_query_count=opts.min_query_count or EARLY_STOPPING_QUERIES[scenario],
            target_qps=target_qps if scenario is Scenario.SERVER else None,
            latency_bound_s=self.bound_s,
            official=opts.official,
            expected_latency_s=self.warmup.latency_s,
            expected_qps=self.warmup.throughput,
            batch_size=batch,
            concurrency=concurrency,
            seed=opts.seed,
            model_key=MLPERF_MODEL_KEYS.get(opts.model, opts.model),
        )

    def offline_shape(self) -> tuple[int, int]:
        """Rows per request and requests in flight of a closed-loop run (Offline, a flood)."""
        # In process, every sample is its own request and the batcher merges them (a few full
        # batches queued keep it busy; more only lengthens its queue scans); over the network,
        # requests carry batches and a few are kept in flight.
        assert self.info is not None
        remote = self.target.kind != "inprocess"
        batch = self.options.batch_size or (32 if remote else 1)
        queued = 4 * (self.info.max_batch_size or 64)
        concurrency = self.options.concurrency or (4 if remote else queued)
        return self.info.batch_limit(batch), concurrency

    # -- runs ------------------------------------------------------------------------------------

    def run(self, settings: RunSettings, log_dir: Path) -> RunResult:
        """One LoadGen test; accuracy runs also check every response."""
        assert self.info is not None and self.samples is not None
        recorder = Recorder()
        label = f"{settings.scenario.loadgen_name}"
        if settings.target_qps:
            label += f" @ {settings.target_qps:,.0f} qps"
        start = time.perf_counter()
        progress = Progress(label, recorder) if self.options.progress else None
        sut: SystemUnderTest | PoolSut
        if self.pool is not None:
            sut = PoolSut(self.pool.connections, self.info, settings, recorder)
        else:
            sut = SystemUnderTest(
                self.target, self.info, self.samples, settings, self.loop, recorder
            )
        try:
            with progress or contextlib.nullcontext():
                recorder.start_ns = time.perf_counter_ns()
                run_loadgen(sut, len(self.samples), settings, log_dir)
        finally:
            sut.close()
        result = RunResult(
            target=self.label,
            settings=settings,
            loadgen=read_logs(log_dir),
            latencies_ns=np.asarray(recorder.latencies_ns, dtype=np.int64),
            request_ns=np.asarray(recorder.request_ns, dtype=np.int64),
            throughput=recorder.throughput(),
            issued=recorder.issued,
            completed=recorder.completed,
            errors=recorder.errors,
            first_errors=recorder.first_errors,
            duration_s=time.perf_counter() - start,
            log_dir=log_dir,
        )
        if settings.accuracy:
            result.accuracy = self._check(recorder.outputs)
        return result

    def scenario(self, scenario: Scenario, log_root: Path) -> ScenarioResult:
        """A scenario as the options ask: a fixed rate, a peak search, plus accuracy."""
        opts = self.options
        assert self.warmup is not None
        folder = log_root / scenario.value
        note = ""
        self.steps(f"{scenario.loadgen_name}: LoadGen runs (each at least {opts.duration_s:g} s)")
        if scenario is Scenario.OFFLINE and opts.concurrency_sweep:
            out = self._concurrency_sweep(folder)
        elif scenario is not Scenario.SERVER:
            result, note = self.sized_run(self.settings(scenario), folder)
            out = ScenarioResult(scenario, result)
        elif opts.find_peak:
            out = self._peak(folder)
        else:
            qps = opts.target_qps
            if qps is None:
                qps = default_server_rate(self.warmup)
                note = f"--target-qps not given: {qps:g}/s, {DEFAULT_RATE_RULE}"
            out = ScenarioResult(scenario, self.run(self.settings(scenario, qps), folder))
        out.note = "; ".join(n for n in (out.note, note) if n)
        if opts.accuracy:
            base = out.main.settings if out.main else self.settings(scenario, opts.target_qps)
            acc = self.run(replace(base, accuracy=True), folder / "accuracy")
            if out.main is not None:
                out.main.accuracy = acc.accuracy
                out.main.errors += acc.errors
                out.main.first_errors.extend(acc.first_errors)
        return out

    def sized_run(self, settings: RunSettings, folder: Path) -> tuple[RunResult, str]:
        """One run; again, sized up, while it ends before LoadGen's minimum duration (the system
        beat the figures the run was sized from), at most `SIZING_RERUNS` times."""
        result = self.run(settings, folder)
        reruns = 0
        while _too_short(result) and reruns < SIZING_RERUNS:
            # LoadGen sized its query from the expected figures and the system beat them.
            settings = _resized(settings, result)
            result = self.run(settings, folder)
            reruns += 1
        if not reruns:
            return result, ""
        return result, f"rerun {reruns}x, sized up: a run ended before the minimum duration"

    def _concurrency_sweep(self, folder: Path) -> ScenarioResult:
        """Offline at each concurrency of the sweep; the headline is the highest throughput."""
        base = self.settings(Scenario.OFFLINE)
        expected = base.expected_qps or 1.0
        runs: list[RunResult] = []
        for concurrency in self.options.concurrency_sweep:
            if not runs:
                # The warm-up ran at the default concurrency: fewer in flight, fewer per second.
                expected *= min(1.0, concurrency / max(base.concurrency, 1))
            settings = replace(base, concurrency=concurrency, expected_qps=expected)
            result, _ = self.sized_run(settings, folder / f"concurrency-{concurrency}")
            runs.append(result)
            expected = max(result.throughput or 0.0, expected)
        best = max(runs, key=lambda r: (r.valid, r.throughput or 0.0))
        points = ", ".join(str(c) for c in self.options.concurrency_sweep)
        note = f"concurrency sweep ({points}); headline: the highest throughput"
        return ScenarioResult(Scenario.OFFLINE, best, runs, note=note, sweep_kind="concurrency")

    def _peak(self, folder: Path) -> ScenarioResult:
        assert self.warmup is not None

        def run_at(qps: float) -> tuple[bool, RunResult]:
            result = self.run(self.settings(Scenario.SERVER, qps), folder / f"qps-{qps:.0f}")
            return result.valid, result

        start = max(1.0, self.warmup.throughput / 2)
        search = find_peak(run_at, start, max_runs=self.options.max_peak_runs)
        sweep = sorted((r for _, _, r in search.runs), key=lambda r: r.settings.target_qps or 0)
        note = (
            f"peak search from {start:,.0f}/s: {len(sweep)} runs, p99 bound "
            f"{self.bound_s * 1e3:g} ms ({self.bound_source})"
        )
        if search.best is None:
            note += "; no rate met the bound"
        return ScenarioResult(
            Scenario.SERVER, search.best, sweep, search.peak_qps, note, sweep_kind="rate"
        )

    # -- accuracy --------------------------------------------------------------------------------

    def _prepare_reference(self) -> None:
        assert self.info is not None and self.samples is not None
        model_file = self.model_file()
        if model_file is not None:
            self._reference = accuracy.reference_outputs(
                model_file, self.samples, self.info.batched
            )
            self._reference_source = str(model_file)
        elif self.samples.labels is None:
            raise BenchError(
                "--accuracy needs something to check against: labels in the data (an .npz with "
                "'labels'), --reference MODEL.onnx, or --repo REPO holding the FP32 model"
            )

    def _check(self, outputs: dict[int, dict[str, np.ndarray]]) -> accuracy.AccuracyResult:
        assert self.samples is not None
        if self.samples.labels is not None and self._reference is None:
            return accuracy.check_labels(self.samples, outputs)
        assert self._reference is not None
        result = accuracy.check_reference(self._reference, outputs, self._reference_source)
        if self.samples.labels is not None:
            labels = accuracy.check_labels(self.samples, outputs)
            result.method += f"; top-1 against labels {labels.fraction:.4f}"
        return result


@contextlib.contextmanager
def opened(
    url: str | None, options: BenchOptions, loop: LoopThread | None = None
) -> Iterator[Session]:
    """A session opened on `loop` (else on a loop of its own, closed after it); closed on exit."""
    with contextlib.ExitStack() as stack:
        if loop is None:
            loop = stack.enter_context(contextlib.closing(LoopThread()))
        session = Session(url, options, loop)
        stack.callback(session.close)
        session.open()
        yield session


def _open_target(url: str | None, o: BenchOptions) -> Target:
    """The target a command line names: a URL, or the in-process model of --repo."""
    if url:
        return RemoteTarget(
            url, o.model, o.version, o.connections, o.shared_memory, o.output_shm_size
        )
    if o.shared_memory != "none":
        raise BenchError("--shared-memory needs a server to share memory with: give a target URL")
    if o.repo is None:
        raise BenchError("give a target URL (http://HOST:PORT, grpc://HOST:PORT) or --repo REPO")
    return InProcessTarget(o.repo, o.model, o.version)


#: LoadGen's error when the queries it generated from the expected figures ran out before the
#: minimum duration (SingleStream and MultiStream: the expected latency was too high).
RAN_OUT = "Ending early: Ran out of generated queries"


def _too_short(result: RunResult) -> bool:
    """The run ended before LoadGen's minimum duration, and nothing else went wrong."""
    reasons = [r for r in result.loadgen.get("reasons", []) if RAN_OUT not in r]
    return reasons == ["Min duration satisfied: NO"] and not result.errors


def sized_up(expected_qps: float | None, reached_qps: float | None) -> float | None:
    """The expected rate of a rerun after a run that ended before LoadGen's minimum duration:
    twice the higher of what it expected and what it reached. A short run measures a rate
    below the system's (its start weighs more), so the rerun at least doubles what the last
    one expected: `SIZING_RERUNS` of them reach 8x or more."""
    return max(expected_qps or 0.0, reached_qps or 0.0) * 2 or None


def _resized(settings: RunSettings, result: RunResult) -> RunSettings:
    p50 = float(np.median(result.latencies_ns)) / 1e9 if len(result.latencies_ns) else 1.0
    return replace(
        settings,
        expected_qps=sized_up(settings.expected_qps, result.throughput),
        expected_latency_s=min(settings.expected_latency_s or 1.0, p50) / 2,
    )
