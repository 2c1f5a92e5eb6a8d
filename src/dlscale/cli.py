"""Command line: argument parsing only; each verb delegates to the package that does the work."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dlscale import __version__
from dlscale.errors import BenchError, DlscaleError

if TYPE_CHECKING:
    from dlscale.bench.session import BenchOptions

#: Each verb group registers its sub-parsers here; the parser's `func` does the work.
Handler = Callable[[argparse.Namespace], int]


def build_parser() -> argparse.ArgumentParser:
    """The whole command line: `dlscale VERB ...`."""
    parser = argparse.ArgumentParser(
        prog="dlscale", description="Deep-learning inference at scale, measured."
    )
    parser.add_argument("--version", action="version", version=f"dlscale {__version__}")
    sub = parser.add_subparsers(dest="verb", metavar="VERB")
    for add in _VERB_GROUPS:
        add(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `dlscale` command."""
    parser = build_parser()
    args = parser.parse_args(argv)
    func: Handler | None = getattr(args, "func", None)
    if func is None:
        parser.print_help()
        return 2
    try:
        return func(args)
    except DlscaleError as exc:
        print(f"dlscale {args.verb}: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


_VERB_GROUPS: list[Callable[[argparse._SubParsersAction[argparse.ArgumentParser]], None]] = []


# -- bench -----------------------------------------------------------------------------------------

#: Sub-verbs of `dlscale bench` (`compare`, `allreduce`, ...): name -> a function that adds the
#: sub-verb's arguments to its own parser and sets `func`. Any other first word is a TARGET.
_BENCH_SUBVERBS: dict[str, Callable[[argparse.ArgumentParser], None]] = {}


def _add_bench_run_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--repo", type=_path, help="model repository (in-process target, or reference)")
    p.add_argument("--model", help="model name")
    p.add_argument("--model-version", default="", help="model version (default: newest)")
    p.add_argument(
        "--scenario",
        default="offline",
        help="singlestream | multistream | server | offline | all (default: offline)",
    )
    rate = p.add_mutually_exclusive_group()
    rate.add_argument("--target-qps", type=float, help="server scenario: arrival rate (queries/s)")
    rate.add_argument(
        "--find-peak", action="store_true", help="server scenario: highest rate whose p99 holds"
    )
    p.add_argument("--latency-bound", help="p99 bound, e.g. 15ms (default: MLPerf's for the model)")
    p.add_argument("--duration", default="10s", help="minimum duration per run (default: 10s)")
    p.add_argument("--official", action="store_true", help="MLPerf minimums: 600 s, query counts")
    p.add_argument(
        "--accuracy", action="store_true", help="also run accuracy mode; check every answer"
    )
    p.add_argument("--data", type=_path, help="samples: FILE.npy (one input) or FILE.npz (by name)")
    p.add_argument("--reference", type=_path, help="FP32 model.onnx to check answers against")
    p.add_argument("--out", type=_path, help="report folder (default: bench-results/MODEL-DATE)")
    p.add_argument("--batch-size", type=int, help="offline: rows per request (remote default 32)")
    p.add_argument("--concurrency", type=int, help="offline: requests in flight (remote default 4)")
    p.add_argument("--connections", type=int, default=64, help="HTTP connection pool size")
    p.add_argument("--samples", type=int, default=256, help="samples kept in memory (default 256)")
    p.add_argument(
        "--min-queries",
        type=int,
        help="minimum queries per run (default: enough for LoadGen's early-stopping estimate)",
    )
    p.add_argument("--seed", type=int, default=0, help="random seed for samples and schedules")
    p.add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="live progress line on stderr (default: when stderr is a terminal)",
    )


def _path(text: str) -> Path:
    return Path(text).expanduser()


def _bench_options(args: argparse.Namespace) -> BenchOptions:
    from dlscale.bench.scenarios import Scenario, parse_duration
    from dlscale.bench.session import BenchOptions

    if not args.model:
        raise BenchError("give the model to benchmark: --model NAME")
    return BenchOptions(
        model=args.model,
        scenarios=Scenario.parse(args.scenario),
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
        concurrency=args.concurrency,
        connections=args.connections,
        sample_count=args.samples,
        min_query_count=args.min_queries,
        progress=sys.stderr.isatty() if args.progress is None else args.progress,
        seed=args.seed,
    )


def _bench_out(args: argparse.Namespace, kind: str) -> Path:
    if args.out is not None:
        return Path(args.out)
    import datetime

    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    return Path("bench-results") / f"{args.model}-{kind}-{stamp}"


def _bench_verdict(report: dict[str, Any]) -> int:
    from dlscale.bench.report import print_summary

    print_summary(report)
    return 0


def _bench_run(args: argparse.Namespace) -> int:
    from dlscale.bench.runner import bench

    if len(args.targets) > 1:
        raise BenchError(
            f"one target per run (got {len(args.targets)}); to compare targets use "
            "`dlscale bench compare TARGET TARGET ...`"
        )
    url = args.targets[0] if args.targets else None
    return _bench_verdict(bench(url, _bench_options(args), _bench_out(args, "bench")))


def _bench_compare(args: argparse.Namespace) -> int:
    from dlscale.bench.runner import compare

    if len(args.targets) < 2:
        raise BenchError("compare needs at least two targets")
    if args.rounds < 1:
        raise BenchError("--rounds must be at least 1")
    options = _bench_options(args)
    return _bench_verdict(compare(args.targets, options, _bench_out(args, "compare"), args.rounds))


def _configure_compare(p: argparse.ArgumentParser) -> None:
    p.description = "The same scenario against several targets in alternation, with ratios."
    p.add_argument("targets", nargs="+", metavar="TARGET", help="http://HOST:PORT or grpc://...")
    p.add_argument("--rounds", type=int, default=3, help="alternation rounds (default 3)")
    _add_bench_run_flags(p)
    p.set_defaults(func=_bench_compare)


def _bench_dispatch(args: argparse.Namespace) -> int:
    words: list[str] = args.words
    if words and words[0] in _BENCH_SUBVERBS:
        sub = argparse.ArgumentParser(prog=f"dlscale bench {words[0]}")
        _BENCH_SUBVERBS[words[0]](sub)
        sub_args = sub.parse_args(words[1:])
        sub_args.verb = f"bench {words[0]}"
        handler: Handler = sub_args.func
        return handler(sub_args)
    # Flags after TARGET arrive unparsed; read them now on top of those given before it.
    again = argparse.ArgumentParser(prog="dlscale bench")
    again.add_argument("targets", nargs="*")
    _add_bench_run_flags(again)
    return _bench_run(again.parse_args(words, namespace=args))


def _add_bench_verbs(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """`dlscale bench [TARGET] ...` and its sub-verbs (`compare`, and those others register)."""
    p = sub.add_parser(
        "bench",
        help="MLPerf LoadGen scenarios against a model in process or an OIP server",
        description=(
            "Benchmark with the MLPerf LoadGen. TARGET is http://HOST:PORT or grpc://HOST:PORT; "
            "without one, --repo REPO serves the model in process through dlscale's batcher. "
            "Sub-verbs: " + ", ".join(sorted(_BENCH_SUBVERBS)) + " (dlscale bench SUBVERB -h)."
        ),
    )
    _add_bench_run_flags(p)
    p.add_argument(
        "words",
        nargs=argparse.REMAINDER,
        metavar="[TARGET | compare TARGET TARGET ... | SUBVERB ...]",
        help="what to measure, or a sub-verb with its own arguments",
    )
    p.set_defaults(func=_bench_dispatch)


_BENCH_SUBVERBS["compare"] = _configure_compare
_VERB_GROUPS.append(_add_bench_verbs)
