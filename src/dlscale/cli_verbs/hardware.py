"""`dlscale catalog`, `devices` and `roofline`: their arguments (hardware/, plan/ run them)."""

from __future__ import annotations

import argparse
from pathlib import Path

from dlscale.cli_verbs import LazyHandler, SubParsers


def add_verbs(sub: SubParsers) -> None:
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
    p.add_argument("--repo", type=Path, help="model repository (default: the zoo, built once)")
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
