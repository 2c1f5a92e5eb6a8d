"""The `dlscale bench [TARGET]` and `dlscale bench compare` verbs; cli.py only parses."""

from __future__ import annotations

import argparse

from dlscale.bench.report import print_summary
from dlscale.bench.results import out_dir
from dlscale.bench.runner import bench, compare
from dlscale.bench.scenarios import Scenario, parse_duration
from dlscale.bench.session import BenchOptions
from dlscale.bench.sweep import parse_concurrency
from dlscale.errors import BenchError


def bench_run(args: argparse.Namespace) -> int:
    """`dlscale bench [TARGET]`: the scenarios against one server, or in process without one."""
    if len(args.targets) > 1:
        raise BenchError(
            f"one target per run (got {len(args.targets)}); to compare targets use "
            "`dlscale bench compare TARGET TARGET ...`"
        )
    if getattr(args, "generative", None):
        from dlscale.bench.generative.commands import bench_generative

        return bench_generative(args)
    if getattr(args, "trace", None) or getattr(args, "shape", None):
        from dlscale.bench.replay_commands import bench_replay

        return bench_replay(args)
    url = args.targets[0] if args.targets else None
    print_summary(bench(url, bench_options(args), out_dir(args.out, f"{args.model}-bench")))
    return 0


def bench_compare(args: argparse.Namespace) -> int:
    """`dlscale bench compare TARGET TARGET ...`: the same scenario on each, in alternation."""
    if len(args.targets) < 2:
        raise BenchError("compare needs at least two targets")
    if args.rounds < 1:
        raise BenchError("--rounds must be at least 1")
    options = bench_options(args)
    out = out_dir(args.out, f"{args.model}-compare")
    print_summary(compare(args.targets, options, out, args.rounds))
    return 0


def bench_options(args: argparse.Namespace) -> BenchOptions:
    """The run's options from the parsed bench flags."""
    if not args.model:
        raise BenchError("give the model to benchmark: --model NAME")
    concurrency, concurrency_sweep = parse_concurrency(args.concurrency)
    return BenchOptions(
        model=args.model,
        scenarios=Scenario.parse(args.scenario or "offline"),
        repo=args.repo,
        version=args.model_version,
        duration_s=parse_duration(args.duration),
        target_qps=args.target_qps,
        find_peak=args.find_peak,
        latency_bound_s=parse_duration(args.latency_bound) if args.latency_bound else None,
        official=args.official,
        accuracy=args.accuracy,
        data=args.data,
        reference=args.reference,
        batch_size=args.batch_size,
        concurrency=concurrency,
        concurrency_sweep=concurrency_sweep,
        workers=args.workers,
        client_ceiling=args.client_ceiling,
        connections=args.connections,
        sample_count=args.samples,
        min_query_count=args.min_queries,
        progress=args.progress,
        seed=args.seed,
        shared_memory=args.shared_memory,
        output_shm_size=args.output_shm_size,
        fleet_metrics=args.fleet_metrics,
    )


def bench_interference(args: argparse.Namespace) -> int:
    """`dlscale bench interference`: the protected model alone and beside a flooding neighbor."""
    from dlscale.bench import interference_report
    from dlscale.bench.interference import InterferenceOptions, run_interference

    options = InterferenceOptions(
        protected=args.protected,
        neighbor=args.neighbor,
        repo=args.repo,
        urls=tuple(args.urls),
        rate=args.rate,
        objective_s=parse_duration(args.objective) if args.objective else None,
        duration_s=parse_duration(args.duration),
        repeats=args.repeats,
        concurrency=args.concurrency,
        neighbor_batch=args.neighbor_batch,
        mig=args.mig,
        seed=args.seed,
        min_queries=args.min_queries,
    )
    out = out_dir(args.out, f"{args.protected}-interference")
    setup, phases, rate = run_interference(options, out)
    report = interference_report.build_report(options, setup, phases, rate)
    interference_report.print_summary(interference_report.write(report, out))
    return 0
