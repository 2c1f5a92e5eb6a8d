"""Writing a report: JSON (everything), Markdown (for people), PNG plots, the terminal table."""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.table import Table

from dlscale.bench import fleet_load, steps, sweep
from dlscale.bench.render import fmt, fmt_ms, fmt_rate, markdown_table, pyplot, rich_table, save
from dlscale.bench.results import RunResult

#: The latency percentiles of the summary table.
SHOWN = ("p50", "p90", "p99", "p99.9")


def write_json(report: dict[str, Any], path: Path) -> Path:
    """The whole report as JSON."""
    path.write_text(json.dumps(report, indent=2, default=str) + "\n")
    return path


def rows(report: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per (target, scenario) headline run, for tables."""
    out = []
    for entry in report.get("scenarios", []):
        res = entry.get("result")
        if res is None:
            out.append({"scenario": entry["scenario"], "target": "-", "verdict": "INVALID"})
            continue
        out.append(
            {
                "target": res["target"],
                "scenario": entry["scenario"],
                "verdict": res["verdict"],
                "qps": res["settings"].get("target_qps"),
                "throughput": res["throughput_samples_per_s"],
                **{p: res["latency_s"].get(p) for p in SHOWN},
                "errors": res["errors"]["count"],
                "accuracy": (res.get("accuracy") or {}).get("fraction"),
                "reasons": res["reasons"],
                "client_bound": res.get("client_bound"),
            }
        )
    return out


def _throughput(row: dict[str, Any]) -> str:
    # A client-bound figure is the client's limit: the server did at least that much.
    text = fmt_rate(row.get("throughput"))
    return f">= {text} (client-bound)" if row.get("client_bound") else text


def ceiling_lines(report: dict[str, Any]) -> list[str]:
    """What the client's ceiling was and which runs reached it (plain text, one per line)."""
    ceiling = report.get("client_ceiling")
    if not ceiling:
        return []
    if ceiling["samples_per_s"] is None:
        return [f"client ceiling: not measured ({ceiling['error']})"]
    lines = [
        f"client ceiling: {ceiling['samples_per_s']:,.1f} samples/s ({ceiling['method']})"
        + (f"; note: {ceiling['error']}" if ceiling.get("error") else "")
    ]
    for r in rows(report):
        if r.get("client_bound"):
            share = r["throughput"] / ceiling["samples_per_s"]
            lines.append(
                f"{r['scenario']} ({r['target']}): client-bound: {r['throughput']:,.1f} "
                f"samples/s is {share:.0%} of the client's ceiling, so it measures this client; "
                "the server's throughput is at least that, not measured (more --workers, or a "
                "bench host of its own)"
            )
    return lines


HEADERS = ("target", "scenario", "verdict", "offered/s", "samples/s",
           *(f"{p} ms" for p in SHOWN), "errors", "accuracy")  # fmt: skip
LEFT = ("target", "scenario", "verdict")


def _cells(r: dict[str, Any], styled: bool = False) -> list[str]:
    """One headline run's row; `styled`: the verdict coloured for the terminal."""
    verdict = r["verdict"]
    if styled:
        verdict = f"[{'green' if verdict == 'VALID' else 'red'}]{verdict}[/]"
    acc = r.get("accuracy")
    return [
        str(r["target"]),
        r["scenario"],
        verdict,
        fmt_rate(r.get("qps")),
        _throughput(r),
        *(fmt_ms(r.get(p)) for p in SHOWN),
        str(r.get("errors", "-")),
        fmt(acc, ".2%"),
    ]


def table(report: dict[str, Any], title: str = "") -> Table:
    """The terminal summary: one row per scenario."""
    title = title or f"dlscale bench: {report['model']['name']}"
    return rich_table(title, HEADERS, [_cells(r, styled=True) for r in rows(report)], LEFT)


def make_console() -> Console:
    """The console every verb prints its tables on: off a terminal (CI logs, pipes) rich would
    squeeze a table into 80 columns and cut its cells to `tar...`, so it gets 160."""
    return Console(width=None if sys.stdout.isatty() else 160)


def peak_lines(report: dict[str, Any]) -> list[str]:
    """A find-peak's outcome in one line per search: the peak rate and its p99, or that none met
    the bound."""
    out = []
    for entry in report.get("scenarios", []):
        if not any(p.get("sweep") == "rate" for p in entry.get("sweep", [])):
            continue
        if entry.get("peak_qps") is None or entry.get("result") is None:
            out.append(f"peak: no rate met the p99 bound ({entry['note']})")
            continue
        p99 = entry["result"]["latency_s"].get("p99")
        out.append(
            f"peak: {entry['peak_qps']:,.1f} queries/s with p99 {fmt_ms(p99)} ms ({entry['note']})"
        )
    return out


def sweep_table(report: dict[str, Any]) -> Table | None:
    """A concurrency sweep's points with each request's latency (the Offline headline's
    LoadGen latency runs from the one query's issue and says nothing per request)."""
    points = sweep.sweep_rows([p for e in report.get("scenarios", []) for p in e.get("sweep", [])])
    if not points:
        return None
    cells = [
        [
            p["target"],
            str(p["concurrency"]),
            _throughput({"throughput": p["throughput_samples_per_s"], **p}),
            fmt_ms(p["request_latency_s"].get("p50")),
            fmt_ms(p["request_latency_s"].get("p99")),
            "VALID" if p["valid"] else "INVALID",
        ]
        for p in points
    ]
    headers = ("target", "concurrency", "samples/s", "p50 ms", "p99 ms", "verdict")
    title = "Concurrency sweep (request latency, sending to answer)"
    return rich_table(title, headers, cells, ("target", "verdict"))


def print_summary(report: dict[str, Any], console: Console | None = None) -> None:
    """The table, the reasons behind any INVALID, and where the report went."""
    # Off a terminal (CI logs, pipes) rich would squeeze the table into 80 columns.
    console = console or make_console()
    console.print(table(report))
    swept = sweep_table(report)
    if swept is not None:
        console.print(swept)
    for line in peak_lines(report):
        console.print(line, style="bold")
    for r in rows(report):
        for reason in r.get("reasons", []):
            console.print(f"[red]{r['scenario']}[/] ({r['target']}): {reason}")
    for line in ceiling_lines(report):
        console.print(line, style="yellow" if "client-bound" in line else None)
    per_step = steps.table(report)
    if per_step is not None:
        console.print(per_step)
    for line in fleet_load.lines(report):
        console.print(line)
    for line in steps.lines(report):
        console.print(line, style="bold")
    roof = report.get("roofline") or {}
    if roof.get("share") is not None:
        console.print(
            f"roofline: {roof['share']:.2%} of {roof['device']} {roof['precision']} "
            f"({roof['attainable_rate']:,.0f} samples/s attainable)"
        )
    if report.get("comparison"):
        console.print(comparison_table(report["comparison"]))
    files = report.get("files", {})
    if files:
        console.print(f"report: {files.get('json')}")


COMPARISON = ("target", "scenario", "samples/s", "ratio", "p99 ms", "ratio", "valid runs")


def _comparison_cells(c: dict[str, Any]) -> list[str]:
    return [
        c["target"],
        c["scenario"],
        fmt_rate(c["throughput"]),
        fmt(c["throughput_ratio"], ".3f"),
        fmt_ms(c["p99_s"]),
        fmt(c["p99_ratio"], ".3f"),
        f"{c['valid_runs']}/{c['runs']}",
    ]


def comparison_table(comparison: list[dict[str, Any]]) -> Table:
    """Each target's median figures and their ratio to the first target."""
    title = "compare (medians over rounds; ratio to the first target)"
    headers = ("target", "scenario", "samples/s", "ratio", "p99 ms", "ratio ", "valid runs")
    return rich_table(title, headers, map(_comparison_cells, comparison), LEFT[:2])


def write_markdown(report: dict[str, Any], path: Path) -> Path:
    """A short human report: what ran, the table, verdicts and reasons, the environment."""
    model = report["model"]
    lines = [
        f"# dlscale bench: {model['name']}",
        "",
        f"- date: {report['date']}",
        f"- targets: {', '.join(t['label'] for t in report['targets'])}",
        f"- data: {report['data']['source']} ({report['data']['samples']} samples)",
        f"- latency bound (p99): {report['latency_bound_s'] * 1e3:g} ms "
        f"({report['latency_bound_source']})",
        f"- host: {report['host']['hostname']} ({report['host']['platform']}, "
        f"{report['host']['logical_cpus']} CPUs)",
        "",
        *markdown_table(HEADERS, map(_cells, rows(report)), LEFT),
        "",
    ]
    for r in rows(report):
        for reason in r.get("reasons", []):
            lines.append(f"- **{r['scenario']}** ({r['target']}) INVALID: {reason}")
    for entry in report.get("scenarios", []):
        if entry.get("note"):
            lines.append(f"- {entry['scenario']}: {entry['note']}")
    if report.get("comparison"):
        lines += ["", "## Comparison (medians over rounds)", ""]
        lines += markdown_table(COMPARISON, map(_comparison_cells, report["comparison"]), LEFT)
    if report.get("client_ceiling"):
        lines += ["", "## Client ceiling", ""] + [f"- {line}" for line in ceiling_lines(report)]
    lines += sweep.markdown([p for e in report.get("scenarios", []) for p in e.get("sweep", [])])
    lines += steps.markdown(report)
    if report.get("replicas"):
        lines += ["", "## Load per replica", ""] + [f"- {x}" for x in fleet_load.lines(report)]
    roof = report.get("roofline") or {}
    lines += ["", "## Roofline", ""]
    if roof.get("share") is not None:
        lines.append(
            f"{roof['flops_per_sample']:.4g} FLOPs/sample; {roof['share']:.2%} of the "
            f"{roof['device']} {roof['precision']} roofline ({roof['bound']}-bound)."
        )
    else:
        flops = fmt(roof.get("flops_per_sample"), ".4g")
        lines.append(f"FLOPs/sample: {flops}. {roof.get('note', '')}")
    plots = report.get("files", {})
    for key in ("latency_png", "sweep_png", "concurrency_png"):
        if plots.get(key):
            lines += ["", f"![{key}]({Path(plots[key]).name})"]
    lines += ["", "LoadGen logs: `loadgen/` beside this file. Full figures: `report.json`.", ""]
    path.write_text("\n".join(lines))
    return path


def plot_latency(runs: Sequence[RunResult], path: Path) -> Path | None:
    """Latency distribution of each headline run (log-scaled histogram)."""
    runs = [r for r in runs if len(r.latencies_ns)]
    if not runs:
        return None
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(8, 4.5))
    all_ms = np.concatenate([r.latencies_ns for r in runs]) / 1e6
    low, high = max(all_ms.min(), 1e-3), max(all_ms.max(), 1e-3 * 1.01)
    bins = np.geomspace(low, high * 1.0001, 60)
    many_targets = len({r.target for r in runs}) > 1
    for r in runs:
        ms = r.latencies_ns / 1e6
        label = r.scenario.loadgen_name + (f" ({r.target})" if many_targets else "")
        ax.hist(ms, bins=list(bins), histtype="step", label=label, linewidth=1.5)
        # The p99 marker takes its histogram's colour (a step histogram is a patch, not a line).
        color = ax.patches[-1].get_edgecolor()
        ax.axvline(np.percentile(ms, 99), linestyle=":", linewidth=1, color=color)
    ax.set_xscale("log")
    ax.set_xlabel("latency (ms), dotted: p99")
    ax.set_ylabel("samples")
    ax.set_title("latency distribution")
    ax.legend()
    return save(fig, path)


@dataclass(frozen=True)
class SweepSeries:
    """One target's points on the sweep plot, in offered-rate order, and how to draw them."""

    target: str
    offered: list[float]
    throughput: list[float]
    p99_ms: list[float]
    invalid: list[bool]
    #: A line joins the points only when they were run at different offered rates.
    is_curve: bool


def sweep_series(points: Sequence[dict[str, Any]]) -> list[SweepSeries]:
    """The sweep plot's series: repeated runs at one rate (compare's rounds) are no curve."""
    usable = [p for p in points if p["p99_s"] is not None and p["throughput_samples_per_s"]]
    out = []
    for target in dict.fromkeys(p["target"] for p in usable):
        mine = sorted(
            (p for p in usable if p["target"] == target), key=lambda p: p["target_qps"] or 0
        )
        out.append(
            SweepSeries(
                target,
                [p["target_qps"] or p["throughput_samples_per_s"] for p in mine],
                [p["throughput_samples_per_s"] for p in mine],
                [p["p99_s"] * 1e3 for p in mine],
                [not p["valid"] for p in mine],
                len({p["target_qps"] for p in mine}) > 1,
            )
        )
    return out


def plot_sweep(points: Sequence[dict[str, Any]], bound_s: float, path: Path) -> Path | None:
    """p99 latency at each offered rate, one colour per target (see sweep_series): the bound as
    a line, INVALID runs crossed out, each target's peak (highest VALID rate) starred and
    labelled with its rate and achieved throughput, so the answer is readable at a glance."""
    series = sweep_series(points)
    if not series:
        return None
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(9, 5))
    crossed = False
    for s in series:
        style = "-" if s.is_curve else "none"
        line = ax.plot(s.offered, s.p99_ms, marker="o", linestyle=style, label=s.target)[0]
        bad = [(x, y) for x, y, b in zip(s.offered, s.p99_ms, s.invalid, strict=True) if b]
        if bad:
            crossed = True
            ax.scatter([b[0] for b in bad], [b[1] for b in bad], marker="x", s=120, color="red")
        _star_peak(ax, s, line.get_color())
    if crossed:
        ax.scatter(
            [],
            [],
            marker="x",
            s=120,
            color="red",
            label="INVALID (p99 over the bound, or too few queries)",
        )
    ax.axhline(bound_s * 1e3, linestyle="--", color="grey", label=f"p99 bound {bound_s * 1e3:g} ms")
    ax.set_xlabel("offered rate (queries/s)")
    ax.set_ylabel("p99 latency (ms, log scale)")
    ax.set_yscale("log")
    ax.grid(True, which="both", alpha=0.3)
    ax.set_title("p99 latency at each offered rate; star: the highest rate that held the bound")
    ax.legend(loc="upper left")
    return save(fig, path)


def _star_peak(ax: Any, s: SweepSeries, color: Any) -> None:
    valid = [i for i, bad in enumerate(s.invalid) if not bad]
    if not valid or not s.is_curve:
        return
    i = max(valid, key=lambda k: s.offered[k])
    ax.scatter([s.offered[i]], [s.p99_ms[i]], marker="*", s=300, color=color, zorder=5)
    ax.annotate(
        f"peak {s.offered[i]:,.0f}/s\n({s.throughput[i]:,.0f} samples/s, p99 {s.p99_ms[i]:.3g} ms)",
        (s.offered[i], s.p99_ms[i]),
        textcoords="offset points",
        xytext=(-40, 40),
        fontsize=9,
        bbox={"boxstyle": "round", "facecolor": "white", "alpha": 0.9},
        arrowprops={"arrowstyle": "->", "color": color},
    )
