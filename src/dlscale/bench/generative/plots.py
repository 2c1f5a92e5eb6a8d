"""The generative report's plots: token throughput against TTFT and TPOT, and their spread."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from dlscale.bench.generative.options import GenerativeOptions
from dlscale.bench.render import percentile_lines, pyplot, save


def label(p: dict[str, Any]) -> str:
    """A point's name: `c=4`, `4/s`, `trace`."""
    if p["load"] == "concurrency":
        return f"c={p['concurrency']}"
    return f"{p['rate']:g}/s" if p["load"] == "rate" else str(p["load"])


def plot_tokens(
    points: Sequence[dict[str, Any]], options: GenerativeOptions, path: Path
) -> Path | None:
    """Output tokens/s against p50 and p99 TTFT (left) and TPOT (right), points labelled by
    their load; the SLO's bounds as dashed lines."""
    usable = [p for p in points if p["output_tokens_per_s"] and p["ttft"]["p50"] is not None]
    if not usable:
        return None
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.5))
    bounds = (options.slo.ttft_s, options.slo.tpot_s)
    for ax, key, bound in zip(axes, ("ttft", "tpot"), bounds, strict=True):
        for load in dict.fromkeys(p["load"] for p in usable):
            mine = [p for p in usable if p["load"] == load and p[key]["p50"] is not None]
            x = [p["output_tokens_per_s"] for p in mine]
            percentile_lines(ax, load, x, [p[key] for p in mine], [label(p) for p in mine])
        if bound:
            ax.axhline(bound * 1e3, linestyle=":", color="grey", label=f"SLO {bound * 1e3:g} ms")
        ax.set_yscale("log")
        ax.set_xlabel("output tokens/s")
        ax.set_ylabel(f"{key.upper()} (ms, log scale)")
        ax.set_title(f"{key.upper()} against output token throughput")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    return save(fig, path)


def plot_distributions(points: Sequence[dict[str, Any]], path: Path) -> Path | None:
    """Each point's per-request TTFT and TPOT as cumulative distributions."""
    rows = [p for p in points if any(r["ttft_s"] is not None for r in p["requests_detail"])]
    if not rows:
        return None
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.5))
    for ax, key in zip(axes, ("ttft_s", "tpot_s"), strict=True):
        for p in rows:
            values = np.sort([r[key] * 1e3 for r in p["requests_detail"] if r[key] is not None])
            if len(values):
                ax.plot(values, np.arange(1, len(values) + 1) / len(values), label=label(p))
        ax.set_xlabel(f"{key[:-2].upper()} (ms)")
        ax.set_ylabel("share of requests")
        ax.set_title(f"{key[:-2].upper()} per request (CDF)")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    return save(fig, path)
