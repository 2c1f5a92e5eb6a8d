"""Command line: argument parsing only; each verb delegates to the package that does the work."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from dlscale import __version__
from dlscale.errors import DlscaleError

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


def _lazy(module: str, name: str) -> Handler:
    """A handler that imports its module only when its verb runs (keeps `dlscale -h` fast)."""

    def run(args: argparse.Namespace) -> int:
        import importlib

        handler: Handler = getattr(importlib.import_module(module), name)
        return handler(args)

    return run


def _add_plan_verbs(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """`dlscale plan train`, `dlscale plan serve`, and `dlscale bench allreduce`."""
    plan = sub.add_parser("plan", help="capacity and training-time planners")
    verbs = plan.add_subparsers(dest="plan_verb", metavar="PLAN", required=True)

    t = verbs.add_parser("train", help="training time on N GPUs with ring or tree all-reduce")
    t.add_argument("--flops-per-sample", type=float, required=True, help="training FLOPs (fwd+bwd)")
    t.add_argument("--samples", type=int, required=True, help="samples per epoch")
    t.add_argument("--epochs", type=float, default=1.0)
    t.add_argument("--gpus", type=int, default=8, help="GPUs per node (default 8)")
    t.add_argument("--nodes", type=int, default=1)
    t.add_argument("--device", default="H100-SXM", help="catalog name (default H100-SXM)")
    t.add_argument("--peak-tflops", type=float, help="per-GPU peak instead of the catalog's")
    t.add_argument("--precision", default="bf16")
    t.add_argument("--intra", default="nvlink4", help="fabric inside a node (default nvlink4)")
    t.add_argument("--inter", help="fabric between nodes, e.g. ib-400g, eth-100g")
    t.add_argument("--nics-per-node", type=int, help="default: one per GPU")
    t.add_argument("--mfu", type=float, default=0.4, help="achieved share of peak (default 0.4)")
    t.add_argument("--gradient-bytes", type=float, default=0.0, help="bytes all-reduced per step")
    t.add_argument("--overlap", type=float, default=0.0, help="share of backward hiding comm")
    t.add_argument("--batch-per-gpu", type=int, default=32)
    t.add_argument("--bytes-per-sample", type=float, default=0.0, help="input bytes per sample")
    t.add_argument("--algo", default="auto", help="ring, tree, hierarchical, in-network, auto")
    t.add_argument("--deadline", help="also show what finishing in this time needs, e.g. 8h")
    t.add_argument("--plot", help="write scaling curves (time, efficiency vs GPUs) to this PNG")
    t.set_defaults(func=_lazy("dlscale.plan.commands", "plan_train"))

    s = verbs.add_parser("serve", help="fewest devices of each kind that hold a p99 SLO")
    s.add_argument("--model", help="zoo model name or .onnx file")
    s.add_argument("--repo", type=Path, help="model repository holding --model")
    s.add_argument("--qps", type=float, required=True, help="requests per second to serve")
    s.add_argument("--p99", required=True, help="p99 latency bound, e.g. 15ms")
    s.add_argument("--devices", help="catalog names, comma-separated")
    s.add_argument("--profile", help="measured batch latencies (JSON, see docs/plan.md)")
    s.add_argument("--efficiency", type=float, help="share of the roofline reached (default 0.4)")
    s.add_argument("--precision", default="int8")
    s.add_argument("--max-batch", type=int, help="largest batch to consider (default 256)")
    s.add_argument("--price", help="dollars per device-hour: H100-SXM=2.5,L4=0.8")
    s.add_argument("--flops-per-sample", type=float, help="instead of counting --model's graph")
    s.add_argument("--bytes-per-sample", type=float, help="with --flops-per-sample")
    s.add_argument("--json", help="also write the plans to this file")
    s.set_defaults(func=_lazy("dlscale.plan.commands", "plan_serve"))

    bench = sub.add_parser("bench", help="benchmarks")
    bench_verbs = bench.add_subparsers(dest="bench_verb", metavar="BENCH", required=True)
    _add_bench_allreduce(bench_verbs)


def _add_bench_allreduce(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """`dlscale bench allreduce`: register under whichever `bench` parser owns the verb."""
    a = sub.add_parser("allreduce", help="time torch.distributed all-reduce beside the model")
    a.add_argument("--nproc", type=int, default=2, help="processes (GPUs with nccl)")
    a.add_argument("--backend", choices=("gloo", "nccl"), default="gloo")
    a.add_argument("--sizes", help="LO:HI bytes, doubling (default 1K:64M gloo, 1K:1G nccl)")
    a.add_argument("--iters", type=int, default=20)
    a.add_argument("--warmup", type=int, default=5)
    a.add_argument("--fabric", help="what the model assumes (default: loopback measured here)")
    a.add_argument("--plot", help="write measured vs model bus bandwidth to this PNG")
    a.add_argument("--json", help="write the report to this file")
    a.set_defaults(func=_lazy("dlscale.plan.commands", "bench_allreduce"))


_VERB_GROUPS.append(_add_plan_verbs)
