"""Command line: argument parsing only; each verb delegates to the package that does the work.

The verbs' arguments are declared by verb group in dlscale.cli_verbs; this module assembles
them into one parser and runs the handler the parsed verb names.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

from dlscale import __version__
from dlscale.cli_verbs import (
    Handler,
    SubParsers,
    bench,
    hardware,
    optimize,
    plan,
    serve,
    zoo_models,
)
from dlscale.errors import DlscaleError

#: The verb groups, in the order `dlscale -h` lists their verbs.
_VERB_GROUPS: list[Callable[[SubParsers], None]] = [
    zoo_models.add_verbs,
    serve.add_verbs,
    zoo_models.add_demo,
    hardware.add_verbs,
    plan.add_verbs,
    bench.add_verbs,
    optimize.add_verbs,
]


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
    if words and words[0] in bench.SUBVERBS:
        holder = argparse.ArgumentParser(prog="dlscale bench")
        subs = holder.add_subparsers(dest="bench_verb", metavar="SUBVERB", required=True)
        bench.SUBVERBS[words[0]](subs)
        args = holder.parse_args(words)
        args.verb = f"bench {words[0]}"
        return args
    # Flags after TARGET arrive unparsed; read them now on top of those given before it.
    again = argparse.ArgumentParser(prog="dlscale bench")
    again.add_argument("targets", nargs="*")
    bench.add_run_flags(again)
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
