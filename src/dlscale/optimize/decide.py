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
#: The source variant of a TensorFlow model (optimize/tf_variants.py): the model as served.
TF_SOURCE_VARIANT = "tf-fp32"


def source_name(trials: list[Trial]) -> str:
    """The name of the trials' source variant: a TensorFlow model's, or the ONNX file's."""
    names = {t.variant.name for t in trials}
    return TF_SOURCE_VARIANT if TF_SOURCE_VARIANT in names else SOURCE_VARIANT


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
        (t for t in trials if t.variant.name == source_name(trials) and t.accepted and t.speed),
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
            f"({_runs(best.speed)} vs {_runs(source.speed)} samples/s); "
            f"{confidence(best.speed, source.speed)}",
        )
    return Decision(
        source,
        True,
        f"FP32 kept: the fastest variant, {best.variant.name}, is within the runs' spread "
        f"({_runs(best.speed)} vs FP32's {_runs(source.speed)} samples/s); nothing to write; "
        f"{confidence(best.speed, source.speed)}",
    )


def confidence(candidate: Speed, base: Speed) -> str:
    """How sure the decision is, in words: the margin between the two sets of runs against the
    run-to-run spread of each (a margin larger than both spreads is a firm lead)."""
    margin = min(_all(candidate)) / max(_all(base)) - 1
    spreads = f"run-to-run spread {candidate.spread:.0%} and FP32's {base.spread:.0%}"
    if margin <= 0:
        return f"confidence: none, the runs overlap ({spreads})"
    firm = margin > max(candidate.spread, base.spread)
    level = "high" if firm else "moderate"
    return f"confidence: {level}, slowest run {margin:.0%} above FP32's fastest ({spreads})"


def _all(speed: Speed) -> tuple[float, ...]:
    return tuple(speed.offline_runs or (speed.offline_sps,))


def clearly_faster(candidate: Speed, base: Speed) -> bool:
    """Whether the candidate's slowest run beats the base's fastest run."""
    return min(_all(candidate)) > max(_all(base))


def _runs(speed: Speed) -> str:
    return "/".join(f"{r:,.0f}" for r in _all(speed))
