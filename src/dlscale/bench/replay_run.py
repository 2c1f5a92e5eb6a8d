"""`dlscale bench URL --trace FILE | --shape burst`: replay a load on its times, report goodput.

Opens one client per model of the load, makes each model's samples, samples the fleet (with
`--fleet-metrics`) while bench/replay.py sends every request at its time, then writes
`report.json` and `timeline.png` (bench/goodput.py, bench/replay_plot.py). docs/bench.md,
"Traces and bursts".
"""

from __future__ import annotations

import contextlib
import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from dlscale.bench import environment, goodput
from dlscale.bench.data import load_samples
from dlscale.bench.fleet_load import families, snapshot
from dlscale.bench.fleet_watch import FleetWatch
from dlscale.bench.loadgen import LoopThread
from dlscale.bench.replay import MAX_IN_FLIGHT, replay
from dlscale.bench.replay_plot import plot_runs
from dlscale.bench.scenarios import latency_bound_for
from dlscale.bench.targets import ModelInfo, RemoteTarget
from dlscale.bench.trace import BurstShape, TraceRequest, burst_trace, read_trace
from dlscale.errors import BenchError
from dlscale.types import Datatype

#: The metrics-page family where a dlscale server states a model's objective ([qos]).
OBJECTIVE_FAMILY = "dlscale_qos_latency_objective_seconds"
#: Seconds between the clients being ready and the first send (the first sends are on time).
LEAD_S = 0.5


@dataclass(frozen=True)
class ReplayOptions:
    """A replay: where, what load (a trace file or a shape), objectives and the fleet's page."""

    url: str
    out: Path
    trace: Path | None = None
    shape: BurstShape | None = None
    #: The shape's model and tenants (a trace names its own).
    model: str | None = None
    tenants: tuple[str, ...] = ("default",)
    #: Every model's objective, seconds; None: each model's own [qos], else the default bound.
    objective_s: float | None = None
    fleet_metrics: str | None = None
    connections: int = 256
    seed: int = 0
    bin_s: float = 1.0
    max_in_flight: int = MAX_IN_FLIGHT

    def load(self) -> list[TraceRequest]:
        """The requests to send, checked and bounded."""
        if (self.trace is None) == (self.shape is None):
            raise BenchError("give one load: --trace FILE or --shape burst")
        if self.objective_s is not None and not self.objective_s > 0:
            raise BenchError(f"--latency-bound must be positive, got {self.objective_s}")
        if not 1 <= self.max_in_flight <= MAX_IN_FLIGHT:
            raise BenchError(f"requests in flight: 1 to {MAX_IN_FLIGHT}")
        if self.trace is not None:
            return read_trace(self.trace)
        assert self.shape is not None
        if not self.model:
            raise BenchError("--shape needs the model to send to: --model NAME")
        return burst_trace(self.shape, self.model, self.tenants, self.seed)


def run_replay(options: ReplayOptions) -> dict[str, Any]:
    """Replay the load against `options.url`; returns the report (also written)."""
    requests = options.load()
    models = sorted({r.model for r in requests})
    _refuse_generative(requests)
    targets = {m: RemoteTarget(options.url, m, connections=options.connections) for m in models}
    with contextlib.closing(LoopThread()) as loop:
        try:
            infos = {m: loop.run(t.open()) for m, t in targets.items()}
            senders = _senders(targets, infos, requests, options.seed)
            objectives = {m: _objective(m, options) for m in models}
            fleet = options.fleet_metrics
            if fleet:
                snapshot(fleet, models[0])  # an unreadable page stops the run before it runs
            start = time.monotonic() + LEAD_S
            watch = FleetWatch(fleet, models, start) if fleet else None
            with watch or contextlib.nullcontext():
                outcomes = loop.run(
                    replay(requests, lambda r: senders[r.model](r), start, options.max_in_flight)
                )
            samples = watch.samples if watch else []
        finally:
            for target in targets.values():
                with contextlib.suppress(Exception):
                    loop.run(target.close())
    data = build_report(options, outcomes, samples, objectives)
    return write(data, outcomes, options.out)


def _refuse_generative(requests: list[TraceRequest]) -> None:
    for r in requests:
        if r.prompt_tokens is not None or r.output_tokens is not None:
            raise BenchError(
                f"a request at t={r.offset_s:g} s gives prompt_tokens/output_tokens: this replay "
                "sends tensors; replay a generative trace with --generative (docs/bench.md)"
            )


def _senders(
    targets: dict[str, RemoteTarget],
    infos: dict[str, ModelInfo],
    requests: list[TraceRequest],
    seed: int,
) -> dict[str, Any]:
    """Per model, a function sending one request's inputs (its own shape, or a sample)."""
    shapes = dict.fromkeys((r.model, r.shape) for r in requests if r.shape is not None)
    arrays = {(model, shape): _shaped(infos[model], shape) for model, shape in shapes}
    senders = {}
    for model, target in targets.items():
        samples = load_samples(infos[model], None, 16, seed)
        plain = [samples.request(infos[model].batched, [i]) for i in range(len(samples))]

        def send(r: TraceRequest, t: RemoteTarget = target, p: list[Any] = plain) -> Any:
            inputs = arrays[(r.model, r.shape)] if r.shape else p[int(r.offset_s * 1e6) % len(p)]
            return t.infer(inputs)

        senders[model] = send
    return senders


def _shaped(info: ModelInfo, shape: tuple[int, ...]) -> dict[str, np.ndarray]:
    """Zeros of `shape` for each input (the server checks the shape against the model)."""
    if any(s.datatype is Datatype.BYTES for s in info.inputs):
        raise BenchError(f"model {info.name!r}: shape is for tensor inputs, not BYTES")
    return {s.name: np.zeros(shape, s.datatype.numpy) for s in info.inputs}


def _objective(model: str, options: ReplayOptions) -> float:
    """The bound a request must meet to count as goodput: the flag, the model's [qos]
    objective on the fleet's page, else the bench's default bound for the model."""
    if options.objective_s is not None:
        return options.objective_s
    if options.fleet_metrics:
        stated = _stated_objective(options.fleet_metrics, model)
        if stated:
            return stated
    return latency_bound_for(model, None)[0]


def _stated_objective(url: str, model: str) -> float | None:
    values = [
        s.value
        for family in families(url)
        for s in family.samples
        if s.name == OBJECTIVE_FAMILY and s.labels.get("model") == model and s.value > 0
    ]
    return max(values) if values else None


def build_report(
    options: ReplayOptions,
    outcomes: list[goodput.Outcome],
    samples: list[goodput.FleetSample],
    objectives: dict[str, float],
) -> dict[str, Any]:
    """The replay's report: goodput, tenants, errors, the fleet, the timeline."""
    end = max([o.sent_s + (o.latency_s or 0.0) for o in outcomes] + [0.0])
    replica_s = goodput.replica_seconds(samples, 0.0, end) if samples else None
    lateness = [o.sent_s - o.offset_s for o in outcomes]
    return {
        "format": "dlscale-bench-replay/1",
        "date": environment.now(),
        "target": options.url,
        "load": _load(options),
        "bin_s": options.bin_s,
        "goodput": goodput.goodput(outcomes, objectives, end, replica_s),
        "tenants": goodput.by_tenant(outcomes, objectives),
        "errors": goodput.errors_by_kind(outcomes),
        "send_lateness_s": {"max": max(lateness, default=0.0), "mean": float(np.mean(lateness))},
        "scaling_events": goodput.scaling_events(samples),
        "replica_load": goodput.replica_load(samples),
        "fleet_samples": [{"t_s": s.at_s, "replicas": s.replicas} for s in samples],
        "timeline": goodput.timeline(outcomes, samples, objectives, options.bin_s),
        "host": environment.host(),
    }


def _load(options: ReplayOptions) -> dict[str, Any]:
    if options.trace is not None:
        return {"trace": str(options.trace)}
    assert options.shape is not None
    shape = asdict(options.shape)
    shape |= {"mean_rate": options.shape.mean_rate, "model": options.model}
    return {"shape": "burst", **shape, "tenants": list(options.tenants), "seed": options.seed}


def write(data: dict[str, Any], outcomes: list[goodput.Outcome], out: Path) -> dict[str, Any]:
    """report.json, timeline.png and requests.jsonl (each request's outcome, in the load's
    order) into `out`; returns the report with their paths."""
    out.mkdir(parents=True, exist_ok=True)
    data["files"] = {
        "json": str(out / "report.json"),
        "plot": str(out / "timeline.png"),
        "requests": str(out / "requests.jsonl"),
    }
    plot_runs({str(data["target"]): data}, out / "timeline.png")
    with (out / "requests.jsonl").open("w") as f:
        f.writelines(json.dumps(asdict(o)) + "\n" for o in outcomes)
    (out / "report.json").write_text(json.dumps(data, indent=1, default=str))
    return data


def summary_lines(data: dict[str, Any]) -> list[str]:
    """The report's headline for the console."""
    g = data["goodput"]
    per_rs = g["goodput_per_replica_s"]
    lines = [
        f"sent {g['sent']}, answered {g['answered']}, within the objective "
        f"{g['within_objective']} over {g['duration_s']:.1f} s: goodput {g['goodput_per_s']:.2f}/s"
        + (f", {per_rs:.3f} per replica-second ({g['replica_seconds']:.0f} replica-s)"
           if per_rs else ""),
        f"errors: {data['errors'] or 'none'}",
    ]  # fmt: skip
    for tenant, t in data["tenants"].items():
        p = t["latency_s"]
        p50, p99 = p["p50"], p["p99"]
        shown = f"p50 {p50 * 1e3:.1f} ms, p99 {p99 * 1e3:.1f} ms" if p99 is not None else "-"
        lines.append(f"tenant {tenant}: {t['answered']}/{t['sent']} answered, {shown}")
    events = ", ".join(
        f"{e['from']}->{e['to']} at {e['t_s']:.0f} s" for e in data["scaling_events"]
    )
    lines.append(f"scaling: {events or 'none'}")
    lines.append(f"report: {data['files']['json']}, plot: {data['files']['plot']}")
    return lines
