"""Which variant wins: the fastest accepted one by median, and only if it beats FP32 clearly.

Every variant is measured several times (MeterSettings.repeats). A variant replaces the FP32
source only when its slowest run is faster than FP32's fastest: a lead inside the runs' spread
is noise, and writing a "faster" version on noise would change what is served for nothing.
When FP32 stays, no version is written: it would be a copy of the source.
"""

from __future__ import annotations

from dataclasses import dataclass

from dlscale.errors import OptimizeError
from dlscale.optimize.measure import Speed
from dlscale.optimize.results import Trial

#: The variant that is the source itself (the FP32 ONNX file, its settings unchanged).
SOURCE_VARIANT = "fp32"


@dataclass(frozen=True)
class Decision:
    """The winner, whether it is the source (nothing to write), and why, in words."""

    winner: Trial
    keeps_source: bool
    reason: str


def fastest(trials: list[Trial]) -> Trial:
    """The accepted, measured trial with the highest median Offline throughput."""
    measured = [t for t in trials if t.accepted and t.speed is not None]
    if not measured:
        raise OptimizeError(
            "no variant was accepted and measured, not even FP32: "
            + "; ".join(f"{t.variant.name}: {t.reason}" for t in trials)
        )
    return max(measured, key=lambda t: t.speed.offline_sps if t.speed else 0.0)


def decide(trials: list[Trial]) -> Decision:
    """The fastest accepted variant if it clearly beats the FP32 source, else the source."""
    best = fastest(trials)
    source = next(
        (t for t in trials if t.variant.name == SOURCE_VARIANT and t.accepted and t.speed),
        None,
    )
    if source is None or source.speed is None:
        return Decision(best, False, f"{best.variant.name}: the fastest accepted variant")
    if best is source:
        return Decision(source, True, "FP32, the source, was the fastest: nothing to write")
    assert best.speed is not None
    if clearly_faster(best.speed, source.speed):
        return Decision(
            best,
            False,
            f"{best.variant.name}: every run faster than FP32's fastest "
            f"({_runs(best.speed)} vs {_runs(source.speed)} samples/s)",
        )
    return Decision(
        source,
        True,
        f"FP32 kept: the fastest variant, {best.variant.name}, is within the runs' spread "
        f"({_runs(best.speed)} vs FP32's {_runs(source.speed)} samples/s); nothing to write",
    )


def clearly_faster(candidate: Speed, base: Speed) -> bool:
    """Whether the candidate's slowest run beats the base's fastest run."""
    slowest = min(candidate.offline_runs or (candidate.offline_sps,))
    fastest_base = max(base.offline_runs or (base.offline_sps,))
    return slowest > fastest_base


def _runs(speed: Speed) -> str:
    runs = speed.offline_runs or (speed.offline_sps,)
    return "/".join(f"{r:,.0f}" for r in runs)
