"""The replay's plot: load and goodput, p99, and the fleet's replicas, on one time axis.

One column per run given (the benchmark of autoscaling arms puts its arms side by side, each
with the same rows): requests sent, answered and within the objective per second; the p99 of
each second's requests against the objective; the replicas serving and each one's answers per
second (from the fleet's metrics).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from dlscale.bench.render import pyplot, save


def plot_runs(runs: Mapping[str, Mapping[str, Any]], path: Path) -> Path:
    """Write the plot of each run's report (`timeline`, `replica_load`, `goodput`) to `path`."""
    plt = pyplot()
    width = len(runs)
    fig, axes = plt.subplots(3, width, figsize=(6.5 * width + 1, 9), sharex="col", squeeze=False)
    for column, (label, run) in enumerate(runs.items()):
        _rates(axes[0][column], run, label)
        _latency(axes[1][column], run)
        _fleet(axes[2][column], run)
        axes[2][column].set_xlabel("seconds from the start")
    path.parent.mkdir(parents=True, exist_ok=True)
    return save(fig, path)


def _rates(ax: Any, run: Mapping[str, Any], label: str) -> None:
    rows = run["timeline"]
    bin_s = run.get("bin_s", 1.0)
    t = [r["t_s"] for r in rows]
    for key, style in (("sent", ":"), ("answered", "-"), ("within_objective", "-")):
        ax.step(t, [r[key] / bin_s for r in rows], style, where="post", label=key)
    per_rs = run["goodput"].get("goodput_per_replica_s")
    extra = f", {per_rs:.2f} good/replica-s" if per_rs else ""
    ax.set_title(f"{label}{extra}")
    ax.set_ylabel("requests/s")
    ax.legend(fontsize="small")


def _latency(ax: Any, run: Mapping[str, Any]) -> None:
    rows = [r for r in run["timeline"] if r["p99_s"] is not None]
    ax.plot([r["t_s"] for r in rows], [r["p99_s"] * 1e3 for r in rows], ".-", label="p99")
    for model, objective in run["goodput"]["objectives_s"].items():
        ax.axhline(objective * 1e3, color="red", linestyle="--", label=f"{model} objective")
    ax.set_yscale("log")
    ax.set_ylabel("p99 of each second (ms)")
    ax.legend(fontsize="small")


def _fleet(ax: Any, run: Mapping[str, Any]) -> None:
    samples = run.get("fleet_samples") or []
    if not samples:
        ax.text(0.5, 0.5, "no fleet metrics (--fleet-metrics URL)", ha="center",
                transform=ax.transAxes)  # fmt: skip
        return
    ax.step([s["t_s"] for s in samples], [s["replicas"] for s in samples], "k-", where="post",
            label="replicas")  # fmt: skip
    ax.set_ylabel("replicas")
    ax.set_ylim(0, max(s["replicas"] for s in samples) + 1)
    load = ax.twinx()
    points = run.get("replica_load") or []
    for replica in sorted({r for p in points for r in p["per_s"]}):
        xs = [p["t_s"] for p in points if replica in p["per_s"]]
        ys = [p["per_s"][replica] for p in points if replica in p["per_s"]]
        load.plot(xs, ys, linewidth=0.8, alpha=0.7)
    load.set_ylabel("each replica's answers/s")
    ax.legend(loc="upper left", fontsize="small")
