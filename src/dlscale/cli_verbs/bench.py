"""`dlscale bench [TARGET]` and its sub-verbs: their arguments (bench/commands.py runs them)."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

from dlscale.cli_verbs import LazyHandler, SubParsers, output_folder
from dlscale.cli_verbs.plan import add_bench_allreduce

#: Each bench verb's --out (bench/results.py `out_dir` names the default folder).
OUT_HELP = "report folder (default: bench-results/NAME-DATE-TIME)"


def add_run_flags(p: argparse.ArgumentParser) -> None:
    """The flags of one bench run: `dlscale bench`'s, `compare`'s, and those after a TARGET."""
    p.add_argument("--repo", type=_path, help="model repository (in-process target, or reference)")
    p.add_argument("--model", help="model name")
    p.add_argument("--model-version", default="", help="model version (default: newest)")
    p.add_argument("--scenario", help="singlestream|multistream|server|offline|all (offline)")
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
    p.add_argument(
        "--data",
        type=_path,
        help="samples: FILE.npy (one input), FILE.npz (by name), or a folder of files (one BYTES "
        "element each: JPEGs, texts)",
    )
    p.add_argument("--reference", type=_path, help="FP32 model.onnx to check answers against")
    p.add_argument("--out", type=output_folder, help=OUT_HELP)
    p.add_argument("--batch-size", type=int, help="offline: rows per request (remote default 32)")
    p.add_argument(
        "--concurrency",
        metavar="N | START:END[:STEP]",
        help="offline: requests in flight (remote default 4); START:END sweeps, doubling from "
        "START (or in STEPs), and draws the throughput-latency curve",
    )
    p.add_argument(
        "--workers",
        type=int,
        default=0,
        help="processes that send, receive and check requests (default 0: LoadGen's own)",
    )
    p.add_argument(
        "--client-ceiling",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="measure the client's ceiling against a null server first (remote; default on)",
    )
    p.add_argument("--connections", type=int, default=64, help="HTTP connection pool size")
    p.add_argument("--samples", type=int, default=256, help="samples kept in memory (default 256)")
    p.add_argument(
        "--min-queries",
        type=int,
        help="minimum queries per run (default: enough for LoadGen's early-stopping estimate)",
    )
    p.add_argument("--seed", type=int, default=0, help="random seed for samples and schedules")
    p.add_argument(
        "--shared-memory",
        choices=["none", "system", "cuda"],
        default="none",
        help="tensors through shared-memory regions the bench fills per query (default none)",
    )
    p.add_argument(
        "--output-shm-size",
        type=int,
        help="bytes of output region per output and request (default: from the output's shape)",
    )
    p.add_argument(
        "--fleet-metrics",
        metavar="URL",
        help="a fleet's metrics (dlscale serve --device-workers/--ray --metrics-port): report "
        "each replica's share of the run",
    )
    p.add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="progress on stderr: a live line on a terminal, else a line every 10 s (default on)",
    )
    from dlscale.bench import replay_flags  # --shape burst ...: declared beside the replay
    from dlscale.bench.generative import flags  # --generative ...: declared beside that bench

    flags.add_flags(p, _path)
    replay_flags.add_flags(p)


def _path(text: str) -> Path:
    return Path(text).expanduser()


def _add_bench_compare(sub: SubParsers) -> None:
    """`dlscale bench compare TARGET TARGET ...`."""
    p = sub.add_parser(
        "compare",
        help="the same scenario against several targets in alternation, with ratios",
        description="The same scenario against several targets in alternation, with ratios.",
    )
    p.add_argument("targets", nargs="+", metavar="TARGET", help="http://HOST:PORT or grpc://...")
    p.add_argument("--rounds", type=int, default=3, help="alternation rounds (default 3)")
    add_run_flags(p)
    p.set_defaults(func=LazyHandler("dlscale.bench.commands", "bench_compare"))


def _add_bench_interference(sub: SubParsers) -> None:
    """`dlscale bench interference [URL [NO_QOS_URL]]`."""
    p = sub.add_parser(
        "interference",
        help="a protected model alone and beside a flooding neighbor, QoS off and on",
        description=(
            "A latency-sensitive model (LoadGen Server at --rate) alone, then beside a neighbor "
            "flooding the same device: in process with the device scheduler off and on, or "
            "against a server URL (and a second one started with --no-qos); --mig also serves "
            "each on its own MIG instance. docs/qos.md."
        ),
    )
    p.add_argument("urls", nargs="*", metavar="URL", help="server to measure [, --no-qos server]")
    p.add_argument("--repo", type=_path, help="model repository (in-process, or --mig)")
    p.add_argument("--protected", required=True, help="the latency-sensitive model")
    p.add_argument("--neighbor", required=True, help="the model that floods the device")
    p.add_argument("--rate", type=float, help="protected requests/s (default: a quarter of peak)")
    p.add_argument("--objective", help="protected p99 objective, e.g. 20ms (default: its [qos])")
    p.add_argument("--duration", default="10s", help="each phase's minimum duration")
    p.add_argument("--repeats", type=int, default=3, help="repetitions (default 3)")
    p.add_argument("--concurrency", type=int, help="the neighbor's requests in flight")
    p.add_argument("--neighbor-batch", type=int, help="rows in each neighbor request")
    p.add_argument("--mig", action="store_true", help="also each tenant on its own MIG instance")
    p.add_argument("--min-queries", type=int, default=100, help="protected queries per phase")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=output_folder, help=OUT_HELP)
    p.set_defaults(func=LazyHandler("dlscale.bench.commands", "bench_interference"))


def _add_bench_multimodel(sub: SubParsers) -> None:
    """`dlscale bench multimodel --repo REPO --memory-budget ...`."""
    p = sub.add_parser(
        "multimodel",
        help="a Zipf mix over many models, under a memory budget and all resident",
        description=(
            "A Zipf mix of requests over every model of --repo (or --copies N of --model): "
            "against `dlscale serve --model-control on-demand --memory-budget B`, and the same "
            "requests against a server holding every model; hit rate, loads, load time, latency "
            "of resident and cold requests, memory sampled every 100 ms. docs/memory.md."
        ),
    )
    p.add_argument("--repo", type=_path, required=True, help="model repository")
    p.add_argument("--model", help="with --copies: the model to serve under N names")
    p.add_argument("--copies", type=int, default=0, help="serve N copies of --model")
    p.add_argument("--memory-budget", required=True, help="e.g. cpu=64MiB (dlscale serve's)")
    p.add_argument("--zipf", type=float, default=1.1, help="Zipf exponent (default 1.1)")
    p.add_argument("--rate", type=float, default=50.0, help="requests/s, Poisson (default 50)")
    p.add_argument("--duration", default="30s", help="each phase's duration (default 30s)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=output_folder, help=OUT_HELP)
    p.set_defaults(func=LazyHandler("dlscale.bench.multimodel_run", "bench_multimodel"))


def add_verbs(sub: SubParsers) -> None:
    """`dlscale bench [TARGET] ...` and its sub-verbs (`compare`, and those others register)."""
    p = sub.add_parser(
        "bench",
        help="MLPerf LoadGen scenarios against a model in process or an OIP server",
        description=(
            "Benchmark with the MLPerf LoadGen. TARGET is http://HOST:PORT or grpc://HOST:PORT; "
            "without one, --repo REPO serves the model in process through dlscale's batcher. "
            "Sub-verbs: " + ", ".join(sorted(SUBVERBS)) + " (dlscale bench SUBVERB -h)."
        ),
    )
    add_run_flags(p)
    p.add_argument(
        "words",
        nargs=argparse.REMAINDER,
        metavar="[TARGET | compare TARGET TARGET ... | SUBVERB ...]",
        help="what to measure, or a sub-verb with its own arguments",
    )
    p.set_defaults(func=LazyHandler("dlscale.bench.commands", "bench_run"))


#: Sub-verbs of `dlscale bench` (`compare`, `allreduce`, ...): name -> a function that adds the
#: sub-verb's parser (with its `func`) to the sub-parsers it is given. Any other first word
#: after `bench` is a TARGET.
SUBVERBS: dict[str, Callable[[SubParsers], None]] = {
    "compare": _add_bench_compare,
    "allreduce": add_bench_allreduce,
    "interference": _add_bench_interference,
    "multimodel": _add_bench_multimodel,
}
