"""What a many-model run measured: hit rate, loads and their times, latency of resident and cold
requests per model, memory against the budget, and a plot over time (docs/memory.md)."""

from __future__ import annotations

import dataclasses
import json
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import numpy as np

from dlscale.bench.multimodel import Phase, Sent
from dlscale.bench.render import pyplot, save


def _pct(values: list[float], q: float) -> float | None:
    return float(np.percentile(values, q)) if values else None


def summary(phase: Phase, baseline: Phase | None = None) -> dict[str, Any]:
    """The figures of one phase; with the all-resident baseline, the same requests compared."""
    ok = [s for s in phase.sent if s.status == 200]
    resident = [s.latency_s for s in ok if not s.cold]
    cold = [s.latency_s for s in ok if s.cold]
    held = [s.resident_bytes for s in phase.samples]
    rss = [s.rss_bytes for s in phase.samples if s.rss_bytes is not None]
    out: dict[str, Any] = {
        "phase": phase.name,
        "requests": len(phase.sent),
        "answered": len(ok),
        "failed": {str(k): v for k, v in Counter(s.status for s in phase.sent).items() if k != 200},
        "hit_rate": len(resident) / len(ok) if ok else None,
        "loads": len(phase.loads()),
        "mean_load_s": float(np.mean(phase.load_s)) if phase.load_s else None,
        "resident_p50_s": _pct(resident, 50),
        "resident_p99_s": _pct(resident, 99),
        "cold_p50_s": _pct(cold, 50),
        "cold_p99_s": _pct(cold, 99),
        "budget_bytes": phase.budget_bytes,
        "max_resident_bytes": max(held) if held else None,
        "samples_over_budget": sum(h > phase.budget_bytes for h in held)
        if phase.budget_bytes
        else 0,
        "samples": len(held),
        "max_rss_bytes": max(rss) if rss else None,
        "models": per_model(phase.sent),
    }
    if baseline is not None:
        out.update(compare(phase, baseline))
    return out


def per_model(sent: list[Sent]) -> dict[str, dict[str, Any]]:
    """Requests, and resident and cold latency, of each model (most asked first)."""
    by_model: dict[str, list[Sent]] = defaultdict(list)
    for s in sent:
        by_model[s.model].append(s)
    out = {}
    for model, mine in sorted(by_model.items(), key=lambda kv: -len(kv[1])):
        ok = [s for s in mine if s.status == 200]
        out[model] = {
            "requests": len(mine),
            "cold": sum(s.cold for s in ok),
            "resident_p99_s": _pct([s.latency_s for s in ok if not s.cold], 99),
            "cold_p50_s": _pct([s.latency_s for s in ok if s.cold], 50),
        }
    return out


def compare(phase: Phase, baseline: Phase) -> dict[str, Any]:
    """The requests resident in `phase` against the same requests (same schedule) in the
    all-resident baseline; each cold model's first answer against a load plus one inference."""
    pairs = [
        (mine, theirs)
        for mine, theirs in zip(phase.sent, baseline.sent, strict=True)
        if mine.status == 200 and theirs.status == 200
    ]
    hits = [(m.latency_s, t.latency_s) for m, t in pairs if not m.cold]
    out: dict[str, Any] = {}
    if hits:
        mine_p99 = float(np.percentile([m for m, _ in hits], 99))
        theirs_p99 = float(np.percentile([t for _, t in hits], 99))
        out["resident_p99_vs_all_resident"] = mine_p99 / theirs_p99
        out["all_resident_p99_same_requests_s"] = theirs_p99
    one = {m: float(np.median([s.latency_s for s in baseline.sent if s.model == m])) for m in
           {s.model for s in baseline.sent}}  # fmt: skip
    load = float(np.mean(phase.load_s)) if phase.load_s else None
    firsts: list[float] = []
    previous: dict[str, bool] = {}
    for s in phase.sent:
        if s.cold and s.status == 200 and not previous.get(s.model, False) and load:
            firsts.append(s.latency_s / (load + one.get(s.model, 0.0)))
        previous[s.model] = s.cold
    if firsts:
        out["cold_first_answer_vs_load_plus_one"] = {
            "count": len(firsts),
            "p50": float(np.median(firsts)),
            "max": float(np.max(firsts)),
            "within_2x": sum(r <= 2.0 for r in firsts) / len(firsts),
        }
    return out


def write(out: Path, phases: list[Phase], figures: list[dict[str, Any]]) -> Path:
    """report.json, summary.md, over-time.png, and each phase's requests (one JSON line per
    request: when it left, its model, latency, status, cold) in `out`."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.json").write_text(json.dumps(figures, indent=2))
    for phase in phases:
        rows = (json.dumps(dataclasses.asdict(s)) for s in phase.sent)
        (out / f"requests-{phase.name}.jsonl").write_text("\n".join(rows) + "\n")
    lines = ["# Many models under a memory budget", ""]
    for f in figures:
        lines.append(f"## {f['phase']}")
        for key, value in f.items():
            if key not in ("phase", "models"):
                lines.append(f"- {key}: {_show(value)}")
        lines.append("")
    (out / "summary.md").write_text("\n".join(lines))
    plot(phases, out / "over-time.png")
    return out


def _show(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return json.dumps(value) if isinstance(value, dict) else str(value)


def plot(phases: list[Phase], path: Path) -> Path:
    """Per second: resident and cold requests, their p99, and the memory held vs the budget."""
    plt = pyplot()
    fig, axes = plt.subplots(3, 1, figsize=(9, 8), sharex=True)
    for phase in phases:
        seconds = int(max((s.at for s in phase.sent), default=0)) + 1
        cold = np.zeros(seconds)
        p99 = np.full(seconds, np.nan)
        for second in range(seconds):
            mine = [s for s in phase.sent if int(s.at) == second and s.status == 200]
            cold[second] = sum(s.cold for s in mine)
            if mine:
                p99[second] = np.percentile([s.latency_s for s in mine], 99) * 1e3
        axes[0].plot(cold, label=f"{phase.name}: cold requests/s")
        axes[1].plot(p99, label=f"{phase.name}: p99 (ms)")
        at = [s.at for s in phase.samples]
        axes[2].plot(at, [s.resident_bytes / 2**20 for s in phase.samples], label=phase.name)
        if phase.budget_bytes:
            axes[2].axhline(phase.budget_bytes / 2**20, linestyle=":", color="red")
    axes[0].set_ylabel("cold requests / s")
    axes[1].set_ylabel("p99 latency (ms)")
    axes[1].set_yscale("log")
    axes[2].set_ylabel("resident (MiB), dotted: budget")
    axes[2].set_xlabel("seconds")
    for ax in axes:
        ax.legend(fontsize=8)
    return save(fig, path, dpi=100)
