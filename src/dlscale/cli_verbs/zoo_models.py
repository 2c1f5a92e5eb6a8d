"""`dlscale zoo`, `models`, `run` and `demo`: their arguments (handlers: dlscale.models, demo)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from dlscale.cli_verbs import (
    LazyHandler,
    SubParsers,
    output_folder,
    positive_int,
    positive_seconds,
)


def add_verbs(sub: SubParsers) -> None:
    """zoo, models and run."""
    zoo = sub.add_parser("zoo", help="build the built-in models").add_subparsers(
        dest="zoo_verb", metavar="ZOO_VERB", required=True
    )
    build = zoo.add_parser("build", help="build zoo models into a model repository")
    build.add_argument("dir", type=output_folder, help="repository folder to write")
    build.add_argument("--models", default="", help="comma-separated names (default: all)")
    build.add_argument("--seq-len", type=int, default=128, help="bert-base sequence length")
    build.set_defaults(func=LazyHandler("dlscale.models.commands", "zoo_build"))
    listing = zoo.add_parser("list", help="every zoo model: task, tensors, size when built")
    listing.add_argument("--dir", type=Path, default=Path(".dlscale/models"), help="zoo folder")
    listing.set_defaults(func=LazyHandler("dlscale.models.zoo.commands", "zoo_list"))
    images = zoo.add_parser("images", help="write the synthetic JPEG set to a folder")
    images.add_argument(
        "--out", type=output_folder, required=True, help="folder to write the JPEGs to"
    )
    images.add_argument("--count", type=int, default=100, help="how many images")
    images.add_argument("--seed", type=int, default=0, help="the set's seed")
    images.add_argument(
        "--size", type=_pixels, default=(500, 375), metavar="WxH", help="WIDTHxHEIGHT in pixels"
    )
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
    convert.add_argument("--dry-run", action="store_true", help="print the TOML, write nothing")
    convert.add_argument(
        "models", nargs=argparse.REMAINDER, action=_NamesAndFlags, metavar="MODEL",
        help="model names (default: every model); --dry-run may come before or after them",
    )  # fmt: skip
    convert.set_defaults(func=LazyHandler("dlscale.models.commands", "models_convert"))

    run = sub.add_parser("run", help="in-process latency and throughput of one model")
    run.add_argument("dir", type=Path, help="model repository")
    run.add_argument("model", help="model name")
    run.add_argument("--batch", type=positive_int, default=32, help="batch size for throughput")
    run.add_argument(
        "--seconds", type=positive_seconds, default=2.0, help="minimum time per measurement"
    )
    run.set_defaults(func=LazyHandler("dlscale.models.commands", "run"))


class _NamesAndFlags(argparse.Action):
    """Model names with --dry-run anywhere among them: argparse alone takes a flag only before
    a list of names (`convert REPO --dry-run a b` would refuse a and b)."""

    def __call__(self, parser: Any, namespace: Any, values: Any, option: str | None = None) -> None:
        if {"-h", "--help"} & set(values):
            parser.print_help()
            parser.exit()
        rest = argparse.ArgumentParser(prog=parser.prog, add_help=False)
        rest.add_argument("models", nargs="*")
        rest.add_argument("--dry-run", action="store_true")
        parsed, unknown = rest.parse_known_intermixed_args(values)
        if unknown:
            parser.error(f"unrecognized arguments: {' '.join(unknown)}")
        namespace.models = parsed.models
        namespace.dry_run = bool(getattr(namespace, "dry_run", False) or parsed.dry_run)


def add_demo(sub: SubParsers) -> None:
    """demo: builds the zoo and shows what dlscale does with it."""
    demo = sub.add_parser("demo", help="build the zoo and show what dlscale does with it")
    demo.add_argument("--dir", type=Path, default=Path(".dlscale/models"), help="zoo folder")
    demo.add_argument("--quick", action="store_true", help="small models only")
    demo.set_defaults(func=LazyHandler("dlscale.demo", "demo"))


def _pixels(text: str) -> tuple[int, int]:
    """`500x375` as (width, height); JPEG's own limit is 65,535 pixels a side."""
    width, sep, height = text.lower().partition("x")
    sides = (int(width), int(height)) if width.isdigit() and height.isdigit() else (0, 0)
    if not sep or not 1 <= min(sides) <= max(sides) <= 65_535:
        raise argparse.ArgumentTypeError(f"{text!r}: expected WIDTHxHEIGHT, 1 to 65535 pixels each")
    return sides
