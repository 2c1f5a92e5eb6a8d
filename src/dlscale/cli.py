"""Command line: argument parsing only; each verb delegates to the package that does the work."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from typing import Any

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


def _add_hardware_verbs(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
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
    p.add_argument("--repo", default=".dlscale/models", help="model repository (MODEL/1/model.onnx)")
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
    from pathlib import Path

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
