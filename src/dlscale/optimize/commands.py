"""The `dlscale optimize` verb; cli.py only parses."""

from __future__ import annotations

import argparse
from functools import partial
from pathlib import Path

from dlscale.bench.scenarios import parse_duration
from dlscale.errors import OptimizeError
from dlscale.optimize.quiet import third_party_output_to
from dlscale.optimize.results import OptimizeResult
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
    log = Path(".dlscale") / "logs" / f"optimize-{args.model}.log"
    # Flushed at once: piped to a log, each step must show when it happens, not at exit.
    say = partial(print, flush=True)
    say(f"third-party output (ONNX Runtime, torch.compile, torchao) goes to {log}")
    with third_party_output_to(log):
        result = run_optimizer(args.repo, args.model, settings, progress=say)
    for line in outcome_lines(result, args.repo / args.model / "config.toml"):
        print(line)
    return 0


def outcome_lines(result: OptimizeResult, config: Path) -> list[str]:
    """What changed on disk, said plainly: the version written (or none), and the SLO tuning's
    config.toml (written or left as it was), with the decision's grounds."""
    if result.written_version is None:
        lines = [f"wrote nothing: {result.model} version {result.source_version} stays"]
    else:
        lines = [f"wrote {result.model} version {result.written_version}"]
    lines[0] += f" ({result.decision}); report: {result.files.get('markdown')}"
    slo = result.slo
    if slo is None:
        return lines
    if slo.winner is None or not slo.winner.peak_qps:
        lines.append(f"SLO: {config} left as it was: {slo.note or 'no point held the bound'}")
    elif slo.verified:
        lines.append(
            f"SLO: wrote batching {slo.winner.point.label} to {config}; "
            f"{slo.rate_qps or 0:,.0f} queries/s verified under the p99 bound"
        )
    else:
        lines.append(
            f"SLO: wrote batching {slo.winner.point.label} to {config} (peak "
            f"{slo.winner.peak_qps:,.0f}/s in the search), but the verification run did not "
            "hold the bound: treat the figure as unconfirmed"
        )
    return lines


def _fraction(text: str) -> float:
    # Read here rather than as an argparse type: a bad value is an optimize error (exit 1).
    value = text.strip()
    try:
        return float(value[:-1]) / 100 if value.endswith("%") else float(value)
    except ValueError:
        raise OptimizeError(
            f"--tolerance {text!r}: expected a percentage (1%) or a fraction"
        ) from None
