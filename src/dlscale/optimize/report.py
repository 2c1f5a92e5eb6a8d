"""The optimizer's report beside the version it wrote: JSON, Markdown and a PNG."""

from __future__ import annotations

import json
import platform
from pathlib import Path
from typing import Any

from dlscale import __version__
from dlscale.bench.render import fmt, markdown_table, pyplot, save
from dlscale.optimize.decide import source_name
from dlscale.optimize.results import OptimizeResult, Trial
from dlscale.optimize.slo import PointOutcome

JSON_NAME, MARKDOWN_NAME, PNG_NAME = "optimize_report.json", "optimize_report.md", "optimize.png"
#: The columns of the variants' table and of the SLO tuning's (Markdown, aligned left).
TRIALS = ("variant", "stage", "status", "Offline samples/s (median ± half the spread)",
          "vs FP32", "SingleStream p90 ms", "accuracy")  # fmt: skip
POINTS = ("instances", "threads", "max batch", "queue delay µs", "batch ms", "ceiling/s",
          "status", "peak qps", "p99 ms at peak", "why")  # fmt: skip


def to_dict(result: OptimizeResult) -> dict[str, Any]:
    """Everything a reader needs to trust the choice."""
    return {
        "format": "dlscale-optimize/1",
        "model": result.model,
        "source_version": result.source_version,
        "written_version": result.written_version,
        "device": result.device,
        "metric": result.metric.value,
        "tolerance": result.tolerance,
        "data": result.data,
        "winner": result.winner.variant.name,
        "decision": result.decision,
        "trials": [t.to_dict() for t in result.trials],
        "skipped": [{"name": s.name, "reason": s.reason} for s in result.skipped],
        "measurement": "MLPerf LoadGen Offline (repeated; median and spread) and SingleStream, "
        "in process through the batcher",
        "previous_config": result.previous_config,
        "slo": result.slo.to_dict() if result.slo else None,
        "elapsed_s": round(result.elapsed_s, 1),
        "host": {"machine": platform.machine(), "processor": platform.processor()},
        "dlscale": __version__,
    }


def write_report(result: OptimizeResult, folder: Path) -> dict[str, str]:
    """Write the three files into `folder`; returns their paths by kind."""
    data = to_dict(result)
    files = {"json": str(folder / JSON_NAME), "markdown": str(folder / MARKDOWN_NAME)}
    png = plot(result, folder / PNG_NAME)
    if png is not None:
        files["png"] = str(png)
    data["files"] = files
    (folder / JSON_NAME).write_text(json.dumps(data, indent=2, default=str) + "\n")
    (folder / MARKDOWN_NAME).write_text(markdown(result, data))
    return files


def _rate(trial: Trial) -> str:
    if trial.speed is None:
        return "-"
    spread = f" ±{trial.speed.spread / 2:.0%}" if len(trial.speed.offline_runs) > 1 else ""
    return f"{trial.speed.offline_sps:,.1f}{spread}"


def _speedup(trial: Trial, base: float | None) -> str:
    if trial.speed is None or not base:
        return "-"
    return f"{trial.speed.offline_sps / base:.2f}x"


def markdown(result: OptimizeResult, data: dict[str, Any]) -> str:
    """The report as Markdown: the decision first, then every variant, then the SLO tuning."""
    source = source_name(result.trials)
    base = next(
        (t.speed.offline_sps for t in result.trials if t.variant.name == source and t.speed), None
    )
    if result.written_version is None:
        outcome = f"Version {result.source_version} **kept**, no version written"
    else:
        outcome = f"Version {result.source_version} → **version {result.written_version}**"
    lines = [
        f"# dlscale optimize: {result.model}",
        "",
        f"{outcome}: `{result.winner.variant.name}` on {result.device}, chosen for the highest "
        f"median Offline throughput among variants within {result.tolerance:.2%} "
        f"({result.metric.value}), if it beats FP32 beyond the runs' spread.",
        "",
        f"Decision: {result.decision}.",
        "",
        f"Validation: {data['data']['validation_rows']} rows from {data['data']['validation']}"
        f"{' with labels' if data['data']['labels'] else ''}; calibration from "
        f"{data['data']['calibration']}. Speed: {data['measurement']}.",
        "",
        *markdown_table(TRIALS, [_trial_cells(t, base) for t in result.trials], TRIALS),
    ]
    failed = [t for t in result.trials if t.status in ("failed", "not-tried")]
    if failed:
        lines += ["", "## Failed or not tried", ""]
        lines += [f"- `{t.variant.name}`: {t.reason}" for t in failed]
    if result.skipped:
        lines += ["", "## Not for this device", ""]
        lines += [f"- `{s.name}`: {s.reason}" for s in result.skipped]
    if result.slo is not None:
        lines += _slo_lines(result)
    lines += [
        "",
        f"Took {result.elapsed_s:.0f} s. Files: "
        + ", ".join(Path(p).name for p in data["files"].values()),
        "",
    ]
    return "\n".join(lines)


def _trial_cells(t: Trial, base: float | None) -> list[Any]:
    p90 = t.speed.singlestream_p90_ms if t.speed else None
    acc = t.accuracy.describe() if t.accuracy else t.reason
    return [t.variant.name, t.stage, t.status, _rate(t), _speedup(t, base), fmt(p90, ".2f"), acc]


def _slo_lines(result: OptimizeResult) -> list[str]:
    slo = result.slo
    assert slo is not None
    lines = ["", f"## SLO tuning: p99 ≤ {slo.bound_s * 1e3:g} ms", ""]
    lines += markdown_table(POINTS, map(_point_cells, slo.outcomes), POINTS)
    if slo.winner is None:
        lines += ["", f"No configuration held the bound: {slo.note}"]
        return lines
    lines += [
        "",
        f"Written to config.toml: `{slo.winner.point.label}` (peak "
        f"{slo.winner.peak_qps or 0:,.0f} qps).",
        "",
        "Verification (LoadGen Server against "
        "the repository as written; a miss steps the rate down):",
        "",
    ]
    for a in (slo.verification or {}).get("attempts", []):
        verdict = "VALID" if a["valid"] else "INVALID: " + "; ".join(a["reasons"])
        p99 = f"{a['p99_ms']:.2f} ms" if a["p99_ms"] is not None else "-"
        lines.append(f"- {a['target_qps']:,.0f} qps: p99 {p99}, {verdict}")
    if slo.rate_qps is None:
        lines += ["", "No verification run held the bound."]
    return lines


def _point_cells(o: PointOutcome) -> list[Any]:
    p = o.point
    peak = f"{o.peak_qps:,.0f}" if o.peak_qps else "-"  # a peak of 0 is none found
    return [
        p.instances, p.threads, p.max_batch_size, p.max_queue_delay_us, f"{o.batch_time_ms:.2f}",
        f"{o.ceiling_sps:,.0f}", o.status, peak, fmt(o.p99_ms, ".2f"), o.reason,
    ]  # fmt: skip


def plot(result: OptimizeResult, path: Path) -> Path | None:
    """Throughput against accuracy deviation, one point per measured variant."""
    points = [t for t in result.trials if t.speed is not None and t.accuracy is not None]
    if not points:
        return None
    fig, ax = pyplot().subplots(figsize=(7, 4.5))
    colors = {"accepted": "tab:green", "rejected": "tab:red"}
    for t in points:
        assert t.speed is not None and t.accuracy is not None
        x, y = t.accuracy.deviation * 100, t.speed.offline_sps
        ax.scatter(
            x,
            y,
            color=colors.get(t.status, "tab:gray"),
            marker="*" if t is result.winner else "o",
            s=160 if t is result.winner else 40,
        )
        ax.annotate(t.variant.name, (x, y), fontsize=7, xytext=(4, 3), textcoords="offset points")
    ax.axvline(
        result.tolerance * 100,
        color="tab:red",
        linestyle="--",
        linewidth=1,
        label=f"tolerance {result.tolerance:.2%}",
    )
    ax.set_xlabel(f"accuracy deviation from FP32, % ({result.metric.value})")
    ax.set_ylabel("Offline throughput, samples/s (LoadGen)")
    ax.set_title(f"{result.model} on {result.device}: variants (star: chosen)")
    ax.legend(loc="best", fontsize=8)
    ax.grid(alpha=0.3)
    return save(fig, path)
