"""The `dlscale optimize` verb; cli.py only parses."""

from __future__ import annotations

import argparse

from dlscale.bench.scenarios import parse_duration
from dlscale.errors import OptimizeError
from dlscale.optimize.search import OptimizeSettings
from dlscale.optimize.search import optimize as run_optimizer


def optimize(args: argparse.Namespace) -> int:
    """`dlscale optimize REPO MODEL`: write the fastest variant in tolerance, tune for an SLO."""
    settings = OptimizeSettings(
        device=args.device,
        tolerance=_fraction(args.tolerance),
        metric=args.metric,
        slo_p99_s=parse_duration(args.slo_p99) if args.slo_p99 else None,
        time_budget_s=parse_duration(args.time_budget),
        only=tuple(p for p in args.only.split(",") if p),
    )
    # Flushed at once: piped to a log, each step must show when it happens, not at exit.
    result = run_optimizer(args.repo, args.model, settings, progress=_say)
    if result.written_version is None:
        done = f"kept {args.model} version {result.source_version}, wrote no version"
    else:
        done = f"wrote {args.model} version {result.written_version}"
    print(f"{done} ({result.decision}); report: {result.files.get('markdown')}")
    if result.slo is not None:
        rate = result.slo.rate_qps
        print(
            "SLO: "
            + (f"{rate:,.0f} qps verified under the bound" if rate else "not verified")
            + f"; config: {args.repo / args.model / 'config.toml'}"
        )
    return 0


def _fraction(text: str) -> float:
    # Read here rather than as an argparse type: a bad value is an optimize error (exit 1).
    value = text.strip()
    try:
        return float(value[:-1]) / 100 if value.endswith("%") else float(value)
    except ValueError:
        raise OptimizeError(
            f"--tolerance {text!r}: expected a percentage (1%) or a fraction"
        ) from None


def _say(message: str) -> None:
    print(message, flush=True)
