"""What the optimizer did and decided: one Trial per variant and the OptimizeResult."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dlscale.optimize.accuracy import AccuracyCheck, Metric
from dlscale.optimize.measure import Speed
from dlscale.optimize.slo import SloResult
from dlscale.optimize.variants import Skipped, Variant


@dataclass
class Trial:
    """One variant's fate: accepted, rejected (with by how much), failed (why) or not tried."""

    variant: Variant
    stage: int
    status: str = "not-tried"
    reason: str = ""
    accuracy: AccuracyCheck | None = None
    speed: Speed | None = None
    build_s: float = 0.0
    folder: Path | None = None

    @property
    def accepted(self) -> bool:
        return self.status == "accepted"

    def to_dict(self) -> dict[str, Any]:
        """JSON form for the report."""
        v = self.variant
        return {
            "name": v.name,
            "stage": self.stage,
            "runtime": v.runtime,
            "precision": v.precision,
            "recipe": v.recipe,
            "params": dict(v.params),
            "backend_options": dict(v.backend_options),
            "status": self.status,
            "reason": self.reason,
            "accuracy": self.accuracy.to_dict() if self.accuracy else None,
            "speed": self.speed.to_dict() if self.speed else None,
            "build_s": round(self.build_s, 3),
        }


@dataclass
class OptimizeResult:
    """Everything the optimizer did and decided; the report is written from this."""

    model: str
    source_version: int
    device: str
    metric: Metric
    tolerance: float
    data: dict[str, Any]
    trials: list[Trial]
    skipped: list[Skipped]
    winner: Trial
    #: The version written; None when FP32, the source, won (a copy would change nothing).
    written_version: int | None
    #: Where the report went: the written version's folder, or the source's.
    version_dir: Path
    previous_config: dict[str, Any]
    slo: SloResult | None = None
    elapsed_s: float = 0.0
    files: dict[str, str] = field(default_factory=dict)
    #: Why the winner won, with the repeated runs it was decided on.
    decision: str = ""
