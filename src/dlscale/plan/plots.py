"""PNG plots of the planners' answers: training scaling curves and all-reduce bandwidth by size.

Figures are drawn on matplotlib's object API (Figure, no pyplot), which renders with Agg and
touches no global backend state.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from matplotlib.figure import Figure

from dlscale.plan.allreduce_bench import BenchRow
from dlscale.plan.collective import Algorithm
from dlscale.plan.train import TrainingPlan


def plot_scaling(
    curves: Mapping[Algorithm, Sequence[TrainingPlan]], path: Path, title: str
) -> Path:
    """Run time and scaling efficiency against GPU count, one line per all-reduce algorithm."""
    fig = Figure(figsize=(10, 4.2), layout="constrained")
    time_ax, eff_ax = fig.subplots(1, 2)
    for algo, plans in curves.items():
        gpus = [p.gpus for p in plans]
        time_ax.plot(gpus, [p.total_s / 3600 for p in plans], marker="o", label=str(algo))
        eff_ax.plot(gpus, [100 * p.efficiency for p in plans], marker="o", label=str(algo))
    time_ax.set(xscale="log", yscale="log", xlabel="GPUs", ylabel="training time (hours)")
    eff_ax.set(xscale="log", xlabel="GPUs", ylabel="scaling efficiency (%)", ylim=(0, 105))
    for ax in (time_ax, eff_ax):
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
    fig.suptitle(title)
    fig.savefig(path, dpi=120)
    return path


def plot_allreduce(rows: Sequence[BenchRow], path: Path, title: str) -> Path:
    """Measured against predicted bus bandwidth (GB/s) by message size."""
    fig = Figure(figsize=(7, 4.2), layout="constrained")
    ax = fig.subplots()
    sizes = [r.nbytes for r in rows]
    ax.plot(sizes, [r.busbw / 1e9 for r in rows], marker="o", label="measured")
    ax.plot(sizes, [r.predicted_busbw / 1e9 for r in rows], marker="x", ls="--", label="cost model")
    ax.set_xscale("log", base=2)
    ax.set(xlabel="bytes per rank", ylabel="bus bandwidth (GB/s)", title=title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.savefig(path, dpi=120)
    return path
