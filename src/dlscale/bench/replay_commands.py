"""`dlscale bench URL --trace FILE | --shape burst`: the replay's flags into options; runs it."""

from __future__ import annotations

import argparse

from dlscale.bench.replay_run import ReplayOptions, run_replay, summary_lines
from dlscale.bench.results import out_dir
from dlscale.bench.scenarios import parse_duration
from dlscale.bench.trace import BurstShape
from dlscale.errors import BenchError


def bench_replay(args: argparse.Namespace) -> int:
    """Replay the trace or shape the flags give against one server; print the summary."""
    for line in summary_lines(run_replay(replay_options(args))):
        print(line)
    return 0


def replay_options(args: argparse.Namespace) -> ReplayOptions:
    """ReplayOptions from the parsed bench flags."""
    if len(args.targets) != 1:
        raise BenchError("a replay takes one target: http://HOST:PORT or grpc://HOST:PORT")
    if args.trace and args.shape:
        raise BenchError("give --trace FILE or --shape burst, not both")
    shape = None
    if args.shape:
        shape = BurstShape(
            rate=args.baseline_rate,
            factor=args.burst_factor,
            before_s=_seconds(args.before),
            burst_s=_seconds(args.burst),
            after_s=_seconds(args.after),
        )
    tenants = tuple(t.strip() for t in args.tenants.split(",") if t.strip())
    name = args.model or (args.trace.stem if args.trace else "replay")
    return ReplayOptions(
        url=args.targets[0],
        out=out_dir(args.out, f"{name}-replay"),
        trace=args.trace,
        shape=shape,
        model=args.model,
        tenants=tenants or ("default",),
        objective_s=parse_duration(args.latency_bound) if args.latency_bound else None,
        fleet_metrics=args.fleet_metrics,
        connections=max(args.connections, 256),
        seed=args.seed,
    )


def _seconds(text: str) -> float:
    """A phase's length: a duration, or 0 for none."""
    return 0.0 if text.strip().rstrip("s") in ("0", "0.0") else parse_duration(text)
