"""What every gpu-check stage shares: the context its command and reader get, and the verdict
row its reader returns (stages.py lists the stages; each stage module imports this one)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass
class Figure:
    """One verdict row: a figure, its target, and whether it was met (None: no target)."""

    name: str
    value: str
    target: str = "-"
    met: bool | None = None


@dataclass
class Context:
    """What a stage's command and reader need: the interpreter, the device, the folders."""

    python: str
    device: str  # "cuda" or "cpu"
    quick: bool
    out: Path  # the stage's own folder under OUT
    budget_s: float

    @property
    def cpu(self) -> bool:
        """Whether this is the CPU run (the dry run that keeps the command from rotting)."""
        return self.device == "cpu"
