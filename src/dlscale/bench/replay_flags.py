"""The replay's flags on `dlscale bench` (`--trace` is shared with the generative bench)."""

from __future__ import annotations

import argparse

from dlscale.bench.trace import BurstShape

_DEFAULT = BurstShape()


def add_flags(p: argparse.ArgumentParser) -> None:
    """`--shape burst` and its figures, `--tenants` (docs/bench.md, "Traces and bursts")."""
    g = p.add_argument_group(
        "traces and bursts (open loop; with --trace FILE.jsonl or --shape burst)"
    )
    g.add_argument("--shape", choices=["burst"], help="a built-in load: baseline, burst, baseline")
    g.add_argument(
        "--baseline-rate",
        type=float,
        default=_DEFAULT.rate,
        help=f"--shape: requests/s outside the burst (default {_DEFAULT.rate:g})",
    )
    g.add_argument(
        "--burst-factor",
        type=float,
        default=_DEFAULT.factor,
        help=f"--shape: the burst's rate over the baseline's (default {_DEFAULT.factor:g})",
    )
    g.add_argument(
        "--before", default=f"{_DEFAULT.before_s:g}s", help="--shape: baseline before the burst"
    )
    g.add_argument("--burst", default=f"{_DEFAULT.burst_s:g}s", help="--shape: the burst's length")
    g.add_argument(
        "--after", default=f"{_DEFAULT.after_s:g}s", help="--shape: baseline after the burst"
    )
    g.add_argument(
        "--tenants",
        default="default",
        help="--shape: tenants, comma-separated, taking the requests in turn (default: one)",
    )
