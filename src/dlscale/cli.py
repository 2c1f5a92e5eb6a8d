"""Command line: argument parsing only; each verb delegates to the package that does the work."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypeAlias

from dlscale import __version__
from dlscale.errors import DlscaleError

#: Each verb group registers its sub-parsers here; the parser's `func` does the work.
Handler = Callable[[argparse.Namespace], int]


def build_parser() -> argparse.ArgumentParser:
    """The whole command line: `dlscale VERB ...`."""
    parser = argparse.ArgumentParser(prog="dlscale", description="Inference at scale, measured.")
    parser.add_argument("--version", action="version", version=f"dlscale {__version__}")
    sub = parser.add_subparsers(dest="verb", metavar="VERB")
    for add in _VERB_GROUPS:
        add(sub)
    return parser


def parse(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Parse a command line; `bench`'s words after the flags become a sub-verb or a TARGET."""
    args = build_parser().parse_args(argv)
    if args.verb != "bench":
        return args
    words: list[str] = args.words
    if words and words[0] in _BENCH_SUBVERBS:
        holder = argparse.ArgumentParser(prog="dlscale bench")
        subs = holder.add_subparsers(dest="bench_verb", metavar="SUBVERB", required=True)
        _BENCH_SUBVERBS[words[0]](subs)
        args = holder.parse_args(words)
        args.verb = f"bench {words[0]}"
        return args
    # Flags after TARGET arrive unparsed; read them now on top of those given before it.
    again = argparse.ArgumentParser(prog="dlscale bench")
    again.add_argument("targets", nargs="*")
    _add_bench_run_flags(again)
    return again.parse_args(words, namespace=args)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `dlscale` command."""
    args = parse(argv)
    func: Handler | None = getattr(args, "func", None)
    if func is None:
        build_parser().print_help()
        return 2
    try:
        return func(args)
    except DlscaleError as exc:
        print(f"dlscale {args.verb}: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


@dataclass(frozen=True)
class LazyHandler:
    """A verb's handler, named by module and function and imported only when the verb runs.

    Parsing imports no handler module, so `dlscale -h` stays fast.
    """

    module: str
    name: str

    def resolve(self) -> Handler:
        """The handler function itself."""
        handler: Handler = getattr(importlib.import_module(self.module), self.name)
        return handler

    def __call__(self, args: argparse.Namespace) -> int:
        return self.resolve()(args)


# A string: argparse._SubParsersAction cannot be subscripted at run time on Python 3.11.
SubParsers: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"


def _add_core_verbs(sub: SubParsers) -> None:
    """zoo, models, run, serve and demo."""
    zoo = sub.add_parser("zoo", help="build the built-in models").add_subparsers(
        dest="zoo_verb", metavar="ZOO_VERB", required=True
    )
    build = zoo.add_parser("build", help="build zoo models into a model repository")
    build.add_argument("dir", type=Path, help="repository folder to write")
    build.add_argument("--models", default="", help="comma-separated names (default: all)")
    build.add_argument("--seq-len", type=int, default=128, help="bert-base sequence length")
    build.set_defaults(func=LazyHandler("dlscale.models.commands", "zoo_build"))
    listing = zoo.add_parser("list", help="every zoo model: task, tensors, size when built")
    listing.add_argument("--dir", type=Path, default=Path(".dlscale/models"), help="zoo folder")
    listing.set_defaults(func=LazyHandler("dlscale.models.zoo.commands", "zoo_list"))
    images = zoo.add_parser("images", help="write the synthetic JPEG set to a folder")
    images.add_argument("--out", type=Path, required=True, help="folder to write the JPEGs to")
    images.add_argument("--count", type=int, default=100, help="how many images")
    images.add_argument("--seed", type=int, default=0, help="the set's seed")
    images.add_argument("--size", default="500x375", help="WIDTHxHEIGHT in pixels")
    images.set_defaults(func=LazyHandler("dlscale.models.zoo.commands", "zoo_images"))

    models = sub.add_parser("models", help="inspect a model repository").add_subparsers(
        dest="models_verb", metavar="MODELS_VERB", required=True
    )
    check = models.add_parser("check", help="validate every model's config and files")
    check.add_argument("dir", type=Path, help="model repository")
    check.add_argument("--load", action="store_true", help="also load each model's runtime")
    check.set_defaults(func=LazyHandler("dlscale.models.commands", "models_check"))
    convert = models.add_parser(
        "convert", help="write config.toml for models configured by config.pbtxt or MLServer"
    )
    convert.add_argument("dir", type=Path, help="model repository")
    convert.add_argument("models", nargs="*", help="model names (default: every model)")
    convert.add_argument("--dry-run", action="store_true", help="print the TOML, write nothing")
    convert.set_defaults(func=LazyHandler("dlscale.models.commands", "models_convert"))

    run = sub.add_parser("run", help="in-process latency and throughput of one model")
    run.add_argument("dir", type=Path, help="model repository")
    run.add_argument("model", help="model name")
    run.add_argument("--batch", type=int, default=32, help="batch size for throughput")
    run.add_argument("--seconds", type=float, default=2.0, help="minimum time per measurement")
    run.set_defaults(func=LazyHandler("dlscale.models.commands", "run"))

    _add_serve(sub)

    demo = sub.add_parser("demo", help="build the zoo and show what dlscale does with it")
    demo.add_argument("--dir", type=Path, default=Path(".dlscale/models"), help="zoo folder")
    demo.add_argument("--quick", action="store_true", help="small models only")
    demo.set_defaults(func=LazyHandler("dlscale.demo", "demo"))


def _add_serve(sub: SubParsers) -> None:
    """`dlscale serve`: its flags are generated from dlscale.server_settings' fields."""
    from dlscale.scale.settings import add_ray_flags
    from dlscale.server_settings.flags import add_serve_flags

    serve = sub.add_parser("serve", help="serve a repository over the Open Inference Protocol")
    add_serve_flags(serve)
    serve.set_defaults(func=LazyHandler("dlscale.server", "serve"))
    add_ray_flags(serve, LazyHandler("dlscale.scale.commands", "serve_on_ray"))


_VERB_GROUPS: list[Callable[[SubParsers], None]] = [_add_core_verbs]


def _add_hardware_verbs(sub: SubParsers) -> None:
    """`catalog`, `devices` and `roofline`: the accelerator catalog, this host, the ceilings."""
    p = sub.add_parser("catalog", help="list the accelerator catalog, or show one entry")
    p.add_argument("name", nargs="?", help="an entry or alias, e.g. H100-SXM, h100, cpu")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=LazyHandler("dlscale.hardware.commands", "catalog"))

    p = sub.add_parser("devices", help="this host's CPU and GPUs (NVML), MIG instances included")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=LazyHandler("dlscale.hardware.commands", "devices"))

    p = sub.add_parser("roofline", help="the highest rate a device allows a model")
    p.add_argument("model", help="a model in the repository, or a label when --flops is given")
    p.add_argument("--device", help="catalog entry (default: this host's first GPU, else CPU)")
    p.add_argument("--precision", default="fp32", help="fp64 fp32 tf32 fp16 bf16 fp8 int8 int4")
    p.add_argument(
        "--batch",
        type=int,
        default=1,
        help="batch the bytes are counted for (the best is shown too)",
    )
    p.add_argument(
        "--repo", type=Path, default=None, help="model repository (default: the zoo, built once)"
    )
    p.add_argument("--flops", type=_quantity, help="FLOPs per sample (e.g. 8.18G)")
    p.add_argument("--bytes", type=_quantity, help="bytes moved per sample (e.g. 25.6M)")
    p.add_argument("--measured", type=float, help="a measured rate (samples/s) to compare")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=LazyHandler("dlscale.plan.commands", "roofline"))


_SI = {"k": 1e3, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15}


def _quantity(text: str) -> float:
    """A number with an optional SI suffix: 8.18G, 25.6M, 1e9."""
    scale = _SI.get(text[-1:], 1.0)
    body = text[:-1] if text[-1:] in _SI else text
    try:
        return float(body) * scale
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r} (e.g. 8.18G)") from None


_VERB_GROUPS.append(_add_hardware_verbs)


def _add_plan_verbs(sub: SubParsers) -> None:
    """`dlscale plan train` and `dlscale plan serve` (`bench allreduce`: see _BENCH_SUBVERBS)."""
    plan = sub.add_parser("plan", help="capacity and training-time planners")
    verbs = plan.add_subparsers(dest="plan_verb", metavar="PLAN", required=True)

    t = verbs.add_parser("train", help="training time on N GPUs with ring or tree all-reduce")
    t.add_argument("--flops-per-sample", type=float, required=True, help="training FLOPs (fwd+bwd)")
    t.add_argument(
        "--samples", type=lambda v: int(float(v)), required=True, help="samples per epoch (1e9 ok)"
    )
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
    t.set_defaults(func=LazyHandler("dlscale.plan.commands", "plan_train"))

    s = verbs.add_parser("serve", help="fewest devices of each kind that hold a p99 SLO")
    s.add_argument("--model", help="zoo model name or .onnx file")
    s.add_argument("--repo", type=Path, help="model repository holding --model")
    s.add_argument("--qps", type=float, help="requests per second to serve")
    s.add_argument("--p99", help="p99 latency bound, e.g. 15ms")
    s.add_argument("--mig", help="a MIG layout on this catalog GPU for the --tenant models")
    s.add_argument(
        "--tenant",
        action="append",
        help="with --mig: model=NAME,qps=Q,p99=15ms[,memory=20GB][,profile=FILE] (repeat)",
    )
    s.add_argument("--devices", help="catalog names, comma-separated")
    s.add_argument("--profile", help="measured batch latencies (JSON, see docs/plan.md)")
    s.add_argument("--efficiency", type=float, help="share of the roofline reached (default 0.4)")
    s.add_argument("--precision", default="int8")
    s.add_argument("--max-batch", type=int, help="largest batch to consider (default 256)")
    s.add_argument("--price", help="dollars per device-hour: H100-SXM=2.5,L4=0.8")
    s.add_argument("--flops-per-sample", type=float, help="instead of counting --model's graph")
    s.add_argument("--bytes-per-sample", type=float, help="with --flops-per-sample")
    s.add_argument("--json", help="also write the plans to this file")
    from dlscale.plan import llm_flags  # a generative model's flags: declared beside its planner

    llm_flags.add_flags(s)
    s.set_defaults(func=LazyHandler("dlscale.plan.commands", "plan_serve"))


def _add_bench_allreduce(sub: SubParsers) -> None:
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
    a.set_defaults(func=LazyHandler("dlscale.plan.commands", "bench_allreduce"))


_VERB_GROUPS.append(_add_plan_verbs)


# -- bench -----------------------------------------------------------------------------------------

#: Sub-verbs of `dlscale bench` (`compare`, `allreduce`, ...): name -> a function that adds the
#: sub-verb's parser (with its `func`) to the sub-parsers it is given. Any other first word
#: after `bench` is a TARGET.
_BENCH_SUBVERBS: dict[str, Callable[[SubParsers], None]] = {}


def _add_bench_run_flags(p: argparse.ArgumentParser) -> None:
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
    p.add_argument("--out", type=_path, help="report folder (default: bench-results/MODEL-DATE)")
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
        "--progress",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="progress on stderr: a live line on a terminal, else a line every 10 s (default on)",
    )
    from dlscale.bench.generative import flags  # --generative ...: declared beside that bench

    flags.add_flags(p, _path)


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
    _add_bench_run_flags(p)
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
    p.add_argument("--out", type=_path, help="report folder (default: bench-results/...)")
    p.set_defaults(func=LazyHandler("dlscale.bench.commands", "bench_interference"))


def _add_bench_verbs(sub: SubParsers) -> None:
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
    p.set_defaults(func=LazyHandler("dlscale.bench.commands", "bench_run"))


_BENCH_SUBVERBS["compare"] = _add_bench_compare
_BENCH_SUBVERBS["allreduce"] = _add_bench_allreduce
_BENCH_SUBVERBS["interference"] = _add_bench_interference
_VERB_GROUPS.append(_add_bench_verbs)


# -- optimize -------------------------------------------------------------------------------------


def _add_optimize_verbs(sub: SubParsers) -> None:
    """optimize: the fastest variant within an accuracy tolerance, and SLO tuning."""
    opt = sub.add_parser(
        "optimize", help="find the fastest variant of a model that keeps its accuracy"
    )
    opt.add_argument("repo", type=Path, help="model repository")
    opt.add_argument("model", help="model name (its newest version is the FP32 reference)")
    opt.add_argument("--device", default="auto", help="auto, cpu or cuda:N (default auto)")
    opt.add_argument("--tolerance", default="1%", help="largest accuracy change (1%% or 0.01)")
    opt.add_argument(
        "--metric",
        default="auto",
        choices=["auto", "top1", "agreement", "cosine", "maxabs"],
        help="accuracy metric (auto: top1 with labels, agreement for classifiers, else cosine)",
    )
    opt.add_argument("--slo-p99", default=None, help="p99 bound to tune batching for (15ms)")
    opt.add_argument("--time-budget", default="10m", help="wall-clock budget (10m, 90s)")
    opt.add_argument("--only", default="", help="comma-separated variant name prefixes to try")
    opt.set_defaults(func=LazyHandler("dlscale.optimize.commands", "optimize"))


_VERB_GROUPS.append(_add_optimize_verbs)
