"""`dlscale bench` and `dlscale bench compare`: run the scenarios, then write the report."""

from __future__ import annotations

import statistics
from contextlib import ExitStack, closing
from pathlib import Path
from typing import Any

from dlscale.bench import ceiling, environment, fleet_load, report, steps, sweep
from dlscale.bench.loadgen import LoopThread
from dlscale.bench.results import RunResult, ScenarioResult, sweep_point
from dlscale.bench.session import BenchOptions, Session, opened
from dlscale.models.precision import precision_of


def bench(url: str | None, options: BenchOptions, out_dir: Path) -> dict[str, Any]:
    """Benchmark one target on the chosen scenarios; returns the report (also written)."""
    options.check()
    with opened(url, options) as session:
        loop = session.loop
        pipeline = loop.run(steps.pipeline_steps(session.target, options.model))
        before = loop.run(session.target.batch_times())
        steps_before = loop.run(steps.snapshot(session.target, options.model, pipeline))
        fleet = options.fleet_metrics
        fleet_before = fleet_load.snapshot(fleet, options.model) if fleet else {}
        results = [session.scenario(s, out_dir / "loadgen") for s in options.scenarios]
        fleet_after = fleet_load.snapshot(fleet, options.model) if fleet else {}
        steps_after = loop.run(steps.snapshot(session.target, options.model, pipeline))
        after = loop.run(session.target.batch_times())
    data = _report([session], results, options)
    # A pipeline: where its time went, step by step (bench/steps.py); None for other models.
    data["steps"] = steps.breakdown(options.model, pipeline, steps_before, steps_after)
    if options.fleet_metrics:
        data["replicas"] = fleet_load.spread(fleet_before, fleet_after)
    if url and options.client_ceiling:
        session.steps("client ceiling: the same load against a null server in a child process")
        ceiling.mark(data, _ceiling(url, session, out_dir / "loadgen" / "client-ceiling"))
    session.steps(f"writing the report and plots into {out_dir}")
    headline = max((r.main.throughput or 0 for r in results if r.main), default=0) or None
    data["roofline"] = environment.roofline(
        session.model_file(), data["device"], data["precision"], headline
    )
    data["profile"] = environment.profile(
        options.model, data["device"], data["precision"], before, after
    )
    return _write(data, results, out_dir)


def _ceiling(url: str, session: Session, log_dir: Path) -> ceiling.Ceiling:
    """The client's ceiling at the run's batch and its largest concurrency."""
    assert session.info is not None
    batch, concurrency = session.offline_shape()
    concurrency = max((concurrency, *session.options.concurrency_sweep))
    return ceiling.measure(url, session.info, session.options, batch, concurrency, log_dir)


def compare(
    urls: list[str], options: BenchOptions, out_dir: Path, rounds: int = 3
) -> dict[str, Any]:
    """The same scenarios against several targets in alternation, `rounds` times, with ratios."""
    options.check()
    per_target: dict[int, list[ScenarioResult]] = {i: [] for i in range(len(urls))}
    with closing(LoopThread()) as loop, ExitStack() as stack:
        sessions = [stack.enter_context(opened(url, options, loop)) for url in urls]
        for n in range(rounds):
            for scenario in options.scenarios:
                for i, s in enumerate(sessions):
                    folder = out_dir / "loadgen" / f"target{i + 1}" / f"round{n + 1}"
                    per_target[i].append(s.scenario(scenario, folder))
    every = [r for i in per_target for r in per_target[i]]
    data = _report(sessions, every, options)
    data["rounds"] = rounds
    data["comparison"] = _ratios(sessions, per_target, options)
    data["roofline"] = environment.roofline(
        sessions[0].model_file(), data["device"], data["precision"], None
    )
    data["profile"] = None
    return _write(data, every, out_dir)


def _ratios(
    sessions: list[Session], per_target: dict[int, list[ScenarioResult]], options: BenchOptions
) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for scenario in options.scenarios:
        firsts: dict[str, float | None] = {}
        for i, s in enumerate(sessions):
            runs = [r.main for r in per_target[i] if r.scenario is scenario and r.main]
            tput = [r.throughput for r in runs if r.throughput]
            p99 = [p for r in runs if (p := r.p99_s) is not None]
            row: dict[str, Any] = {
                "target": s.label,
                "scenario": scenario.loadgen_name,
                "runs": len(runs),
                "valid_runs": sum(r.valid for r in runs),
                "throughput": statistics.median(tput) if tput else None,
                "throughput_rounds": tput,
                "p99_s": statistics.median(p99) if p99 else None,
                "p99_rounds_s": p99,
            }
            if i == 0:
                firsts = {"throughput": row["throughput"], "p99_s": row["p99_s"]}
            for key, name in (("throughput", "throughput_ratio"), ("p99_s", "p99_ratio")):
                base = firsts.get(key)
                row[name] = row[key] / base if base and row[key] is not None else None
            out.append(row)
    return out


def _report(
    sessions: list[Session], results: list[ScenarioResult], options: BenchOptions
) -> dict[str, Any]:
    first = sessions[0]
    info = first.info
    assert info is not None and first.samples is not None and first.warmup is not None
    return {
        "format": "dlscale-bench/1",
        "date": environment.now(),
        "targets": [{"label": s.label, "kind": s.target.kind} for s in sessions],
        "model": {
            "name": info.name,
            "version": options.version,
            "platform": info.platform,
            "batched": info.batched,
            "max_batch_size": info.max_batch_size,
            "inputs": [t.to_dict() for t in info.inputs],
            "outputs": [t.to_dict() for t in info.outputs],
            "file": str(first.model_file()) if first.model_file() else None,
        },
        "data": {"source": first.samples.source, "samples": len(first.samples)},
        "latency_bound_s": first.bound_s,
        "latency_bound_source": first.bound_source,
        "options": {k: str(v) if isinstance(v, Path) else v for k, v in vars(options).items()},
        "warmup": [
            {"target": s.label, "latency_s": s.warmup.latency_s, "throughput": s.warmup.throughput}
            for s in sessions
            if s.warmup
        ],
        "scenarios": [r.to_dict() for r in results],
        "client_ceiling": None,
        "device": environment.device_name(s.info for s in sessions),
        "device_note": (
            "remote targets: the device is this host's, which is right only when the server "
            "runs here"
            if any(s.target.kind != "inprocess" for s in sessions)
            else "in-process"
        ),
        "precision": precision_of(first.model_file()),
        "host": environment.host(),
        "packages": environment.packages(),
    }


def _write(data: dict[str, Any], results: list[ScenarioResult], out_dir: Path) -> dict[str, Any]:
    out_dir.mkdir(parents=True, exist_ok=True)
    mains: list[RunResult] = [r.main for r in results if r.main is not None]
    pngs = {"latency_png": report.plot_latency(mains, out_dir / "latency.png")}
    by_rate = [r for r in results if r.sweep_kind != "concurrency"]
    points = [
        sweep_point(run, r.sweep_kind)
        for r in by_rate
        for run in (r.sweep or ([r.main] if r.main else []))
    ]
    if any(r.sweep for r in by_rate) or len(data["targets"]) > 1:
        pngs["sweep_png"] = report.plot_sweep(
            points, data["latency_bound_s"], out_dir / "sweep.png"
        )
    concurrency_points = [p for entry in data["scenarios"] for p in entry["sweep"]]
    ceiling_rate = (data.get("client_ceiling") or {}).get("samples_per_s")
    pngs["concurrency_png"] = sweep.plot(
        concurrency_points, ceiling_rate, out_dir / "concurrency.png"
    )
    files = {key: str(png) for key, png in pngs.items() if png}
    files["json"] = str(out_dir / "report.json")
    files["markdown"] = str(out_dir / "report.md")
    files["loadgen_logs"] = str(out_dir / "loadgen")
    data["files"] = files
    report.write_markdown(data, out_dir / "report.md")
    report.write_json(data, out_dir / "report.json")
    return data
