"""Command line: argument parsing only; each verb delegates to the package that does the work."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeAlias

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
    build.set_defaults(func=_zoo_build)

    models = sub.add_parser("models", help="inspect a model repository").add_subparsers(
        dest="models_verb", metavar="MODELS_VERB", required=True
    )
    check = models.add_parser("check", help="validate every model's config and files")
    check.add_argument("dir", type=Path, help="model repository")
    check.add_argument("--load", action="store_true", help="also load each model's runtime")
    check.set_defaults(func=_models_check)

    run = sub.add_parser("run", help="in-process latency and throughput of one model")
    run.add_argument("dir", type=Path, help="model repository")
    run.add_argument("model", help="model name")
    run.add_argument("--batch", type=int, default=32, help="batch size for throughput")
    run.add_argument("--seconds", type=float, default=2.0, help="minimum time per measurement")
    run.set_defaults(func=_run)

    serve = sub.add_parser("serve", help="serve a repository over the Open Inference Protocol")
    serve.add_argument("repo", type=Path, help="model repository")
    serve.add_argument("--host", default="127.0.0.1", help="address to bind (default loopback)")
    serve.add_argument("--http-port", type=int, default=8000, help="REST port; -1 turns it off")
    serve.add_argument("--grpc-port", type=int, default=8001, help="gRPC port; -1 turns it off")
    serve.add_argument("--metrics-port", type=int, default=8002, help="-1 turns metrics off")
    serve.add_argument(
        "--model-control",
        choices=["none", "explicit", "poll"],
        default="none",
        help="none: load all, no API loads; explicit: load via API; poll: follow the folder",
    )
    serve.add_argument("--load-model", action="append", default=[], help="explicit mode: load")
    serve.add_argument("--poll-interval", type=float, default=5.0, help="poll mode: seconds")
    serve.add_argument("--max-body-mb", type=float, default=64, help="REST body size limit")
    serve.add_argument("--max-grpc-mb", type=float, default=64, help="gRPC message size limit")
    serve.add_argument("--log-level", default="INFO", help="DEBUG, INFO, WARNING")
    serve.set_defaults(func=_serve)

    demo = sub.add_parser("demo", help="build the zoo and show what dlscale does with it")
    demo.add_argument("--dir", type=Path, default=Path(".dlscale/models"), help="zoo folder")
    demo.add_argument("--quick", action="store_true", help="small models only")
    demo.set_defaults(func=_demo)


def _zoo_build(args: argparse.Namespace) -> int:
    from dlscale.models.zoo import build_zoo

    names = [n for n in args.models.split(",") if n] or None
    for path in build_zoo(args.dir, names, seq_len=args.seq_len, progress=print):
        print(f"built {path}")
    return 0


def _models_check(args: argparse.Namespace) -> int:
    from dlscale.models.repository import ModelRepository
    from dlscale.models.runner import load_for_run
    from dlscale.models.signature import reconcile

    repo = ModelRepository(args.dir)
    failed = 0
    for result in repo.check():
        error = result.error
        if error is None and args.load:
            try:
                for mv in repo.versions(result.name):
                    backend = load_for_run(mv)
                    reconcile(mv.config, backend.inputs, backend.outputs, mv.path.parent)
                    backend.unload()
            except DlscaleError as exc:
                error = str(exc)
        if error is None:
            print(f"ok     {result.name} (versions {list(result.versions)})")
        else:
            failed += 1
            print(f"FAILED {result.name}: {error}")
    return 1 if failed else 0


def _run(args: argparse.Namespace) -> int:
    from dlscale.models.repository import ModelRepository
    from dlscale.models.runner import run_model

    version = ModelRepository(args.dir).version(args.model)
    one, many = run_model(version, args.batch, min_seconds=args.seconds)
    print(f"model {args.model} v{version.version} on cpu")
    print(
        f"  batch 1: median {one.median_ms:.3f} ms, p90 {one.p90_ms:.3f} ms "
        f"({len(one.seconds)} runs)"
    )
    print(
        f"  batch {args.batch}: {many.throughput:.1f} samples/s "
        f"(median {many.median_ms:.3f} ms per batch, {len(many.seconds)} runs)"
    )
    return 0


def _serve(args: argparse.Namespace) -> int:
    import asyncio
    import logging

    from dlscale.frontends.server import Server, ServerSettings

    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )

    def port(value: int) -> int | None:
        return None if value < 0 else value

    settings = ServerSettings(
        repository=args.repo,
        host=args.host,
        http_port=port(args.http_port),
        grpc_port=port(args.grpc_port),
        metrics_port=port(args.metrics_port),
        model_control=args.model_control,
        load_models=tuple(args.load_model),
        poll_interval_s=args.poll_interval,
        max_body_bytes=int(args.max_body_mb * 2**20),
        max_grpc_message_bytes=int(args.max_grpc_mb * 2**20),
    )
    asyncio.run(Server(settings).serve_forever())
    return 0


def _demo(args: argparse.Namespace) -> int:
    from dlscale.demo import run_demo

    return run_demo(args.dir, quick=args.quick)


_VERB_GROUPS: list[Callable[[SubParsers], None]] = [_add_core_verbs]


def _add_hardware_verbs(sub: SubParsers) -> None:
    """`catalog`, `devices` and `roofline`: the accelerator catalog, this host, the ceilings."""
    p = sub.add_parser("catalog", help="list the accelerator catalog, or show one entry")
    p.add_argument("name", nargs="?", help="an entry or alias, e.g. H100-SXM, h100, cpu")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=_catalog)

    p = sub.add_parser("devices", help="this host's CPU and GPUs (NVML), MIG instances included")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=_devices)

    p = sub.add_parser("roofline", help="the highest rate a device allows a model")
    p.add_argument("model", help="a model in the repository, or a label when --flops is given")
    p.add_argument("--device", help="catalog entry (default: this host's first GPU, else CPU)")
    p.add_argument("--precision", default="fp32", help="fp64 fp32 tf32 fp16 bf16 fp8 int8 int4")
    p.add_argument("--batch", type=int, default=1, help="batch size the bytes are counted for")
    p.add_argument(
        "--repo", default=".dlscale/models", help="model repository (MODEL/1/model.onnx)"
    )
    p.add_argument("--flops", type=_quantity, help="FLOPs per sample (e.g. 8.18G)")
    p.add_argument("--bytes", type=_quantity, help="bytes moved per sample (e.g. 25.6M)")
    p.add_argument("--measured", type=float, help="a measured rate (samples/s) to compare")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=_roofline)


def _catalog(args: argparse.Namespace) -> int:
    import json

    from dlscale.hardware.catalog import load_catalog
    from dlscale.hardware.report import catalog_table, device_text

    catalog = load_catalog()
    if args.name:
        spec = catalog.get(args.name)
        print(json.dumps(spec.to_dict(), indent=2) if args.json else device_text(spec))
    elif args.json:
        print(json.dumps([spec.to_dict() for spec in catalog], indent=2))
    else:
        print(catalog_table(catalog))
    return 0


def _devices(args: argparse.Namespace) -> int:
    import json

    from dlscale.hardware.detect import detect
    from dlscale.hardware.report import host_text

    host = detect()
    print(json.dumps(host.to_dict(), indent=2) if args.json else host_text(host))
    return 0


def _roofline(args: argparse.Namespace) -> int:
    import json

    from dlscale.hardware.catalog import load_catalog
    from dlscale.hardware.report import roofline_text
    from dlscale.hardware.roofline import roofline

    catalog = load_catalog()
    spec = catalog.get(args.device or _local_device())
    flops, nbytes = args.flops, args.bytes
    if flops is None or nbytes is None:
        cost = _model_cost(args.repo, args.model)
        flops = cost.flops if flops is None else flops
        nbytes = cost.bytes_per_sample(args.precision, args.batch) if nbytes is None else nbytes
    line = roofline(spec, args.precision, flops, nbytes)
    if args.json:
        print(json.dumps({"model": args.model, **line.to_dict(args.measured)}, indent=2))
    else:
        print(roofline_text(args.model, line, args.measured))
    return 0


def _local_device() -> str:
    """This host's first GPU that the catalog knows, else the CPU entry."""
    from dlscale.hardware.detect import detect

    return next((g.catalog for g in detect().gpus if g.catalog), "CPU")


def _model_cost(repo: str, model: str) -> Any:
    """The model's FLOP and byte counts from its ONNX file (dlscale.models.flops.count)."""
    import importlib

    from dlscale.errors import NotFound

    path = Path(repo) / model / "1" / "model.onnx"
    if not path.exists():
        raise NotFound(f"no ONNX model at {path}; give --repo, or --flops and --bytes")
    # Imported by name: the FLOP counter lives in dlscale.models, which may be absent in a
    # trimmed install; --flops/--bytes work without it.
    flops = importlib.import_module("dlscale.models.flops")
    return flops.count(path)


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
