"""Optimize: the fastest variant of a model for the device at hand, accuracy proven, SLO tuned."""

from __future__ import annotations

from dlscale.optimize.results import OptimizeResult, Trial
from dlscale.optimize.search import OptimizeSettings, optimize

__all__ = ["OptimizeResult", "OptimizeSettings", "Trial", "optimize"]
