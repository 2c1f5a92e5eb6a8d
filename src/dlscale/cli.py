"""Command line: argument parsing only; each verb delegates to the package that does the work."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

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
